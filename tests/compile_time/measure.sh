#!/usr/bin/env bash
# Compile times of the training program (docs/headers.md, "Compile time of a training program"):
# each configuration compiled REPEATS times (default 3) at -O2 into an object file, the least wall
# and user seconds and the peak memory printed. Run from the repository's root:
#   tests/compile_time/measure.sh [REPEATS] [INCLUDE_DIR]
set -euo pipefail
repeats=${1:-3}
include=${2:-include}
openblas=/usr/include/x86_64-linux-gnu/openblas-pthread
mpi=$(mpicxx --showme:compile 2>/dev/null || true)
src=tests/compile_time/training_program.cpp
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
measure() {  # name, extra flags...
  local name=$1 best_wall=1e9 best_user=1e9 peak=0
  shift
  for ((i = 0; i < repeats; ++i)); do
    /usr/bin/time -f "%e %U %M" -o "$out/time" g++ -std=gnu++20 -O2 -DNDEBUG -I"$include" -I"$openblas" "$@" \
      -c "$src" -o "$out/program.o"
    read -r wall user kb < "$out/time"
    best_wall=$(awk -v a="$best_wall" -v b="$wall" 'BEGIN { print (b < a) ? b : a }')
    best_user=$(awk -v a="$best_user" -v b="$user" 'BEGIN { print (b < a) ? b : a }')
    peak=$(( kb > peak ? kb : peak ))
  done
  printf '%-44s wall %6.2f s  user %6.2f s  peak %4d MB\n' "$name" "$best_wall" "$best_user" $((peak / 1024))
}
uptime
measure "one trainer, header-only"
measure "one trainer, ddp::runtime" -DDDP_COMPILED_RUNTIME=1
if [ -n "$mpi" ]; then
  # shellcheck disable=SC2086
  measure "in-process + MPI trainers, header-only" $mpi -DTRAINING_PROGRAM_WITH_MPI=1
  # shellcheck disable=SC2086
  measure "in-process + MPI trainers, ddp::runtime" $mpi -DTRAINING_PROGRAM_WITH_MPI=1 -DDDP_COMPILED_RUNTIME=1 \
    -DDDP_COMPILED_MPI_RUNTIME=1
fi
uptime
