#!/usr/bin/env bash
# Scaling of the Fashion-MNIST example: training samples/s at 2 ranks against 1 rank with the
# same per-rank batch (64), measured in one invocation with the runs alternated (1, 2, 1, 2, ...).
# Each run trains 2 epochs; the rate of an epoch counts training steps only (the example times
# the epoch before it evaluates). The best epoch of each rank count is kept: on a shared machine
# the least disturbed one.
# Then build/bench/ddp-bench scaling measures the same model in one process, 1 rank, 2 ranks and two
# independent single-rank trainings at once interleaved in short rounds: the last is what this
# machine allows two ranks of this model without any communication (the ceiling), and the ratio
# of 2 ranks to it is what ddp itself costs.
#   bench/scaling.sh [build dir] [repeats]
set -euo pipefail
build=${1:-build}
repeats=${2:-2}
exe="$build/examples/fashion_mnist/fashion_mnist"
[ -x "$exe" ] || { echo "build the example first: cmake --build $build --target fashion_mnist" >&2; exit 1; }
source "$(dirname "$0")/../scripts/openblas-env.sh"
echo "# command: $0 $*   ($(date -u +%F), $(nproc) cores, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset})"
declare -A best=([1]=0 [2]=0)
for ((i = 0; i < repeats; i++)); do
  for ranks in 1 2; do
    rates=$("$exe" --ranks "$ranks" --batch 64 --epochs 2 --no-progress |
            sed -n 's/^epoch [0-9]*\/[0-9]*:.*, \([0-9]*\) samples\/s$/\1/p' | tr '\n' ' ')
    echo "ranks $ranks: epochs at ${rates}samples/s"
    for r in $rates; do ((r > best[$ranks])) && best[$ranks]=$r; done
  done
done
awk -v a="${best[1]}" -v b="${best[2]}" \
  'BEGIN { printf "best epoch: 1 rank %d samples/s, 2 ranks %d samples/s, speed-up %.2fx\n", a, b, b / a }'
[ -x "$build/bench/hardware_scaling" ] && "$build/bench/hardware_scaling"
if [ -x "$build/bench/ddp-bench" ]; then "$build/bench/ddp-bench" scaling --rounds 16 --steps 80; fi
