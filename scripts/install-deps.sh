#!/usr/bin/env bash
# Installs what ddp builds with from Debian packages. Idempotent: when every package is already
# installed it returns at once without touching apt.
#   scripts/install-deps.sh          what the library, the examples and the tests build with
#   scripts/install-deps.sh --fuzz   and clang with its sanitizer and libFuzzer runtimes (the test
#                                    command's sanitizer stage and scripts/fuzz.sh)
set -euo pipefail
packages=(
  cmake g++ make pkg-config
  doctest-dev librange-v3-dev libcli11-dev libbenchmark-dev nlohmann-json3-dev
  libopenblas-dev zlib1g-dev dataset-fashion-mnist
  fortunes  # examples/char_gpt's corpus (/usr/share/games/fortunes)
  openmpi-bin libopenmpi-dev iproute2
  libtorch-dev
)
[ "${1:-}" = --fuzz ] && packages+=(clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
