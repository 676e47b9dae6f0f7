#!/usr/bin/env bash
# A compiler launcher (CXX_COMPILER_LAUNCHER) for units that are checked, never linked: the
# documentation's snippets and the header check's units. The compiler reads the unit with
# -fsyntax-only (templates are instantiated, static_asserts and concepts checked, warnings given;
# no code is generated, half the time of -O0), and the object file the build expects is left
# empty, so that an unchanged unit is not checked again.
#   syntax_only.sh <compiler> <arguments...> -o <object> -c <source>
set -euo pipefail
args=()
out=
while [ $# -gt 0 ]; do
  case $1 in
    -o) out=$2; shift 2 ;;
    -c) shift ;;
    *) args+=("$1"); shift ;;
  esac
done
[ -z "$out" ] || mkdir -p "$(dirname "$out")"  # beside it, the dependency file the compiler writes
"${args[@]}" -fsyntax-only
[ -z "$out" ] || : > "$out"
