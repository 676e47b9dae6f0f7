#!/usr/bin/env bash
# Scaling of the Fashion-MNIST example: samples/s at 2 ranks against 1 rank with the same
# per-rank batch, runs alternated (1, 2, 1, 2, ...) in one invocation; the best of each is kept.
#   bench/scaling.sh [build dir] [repeats]
set -euo pipefail
build=${1:-build}
repeats=${2:-2}
exe="$build/examples/fashion_mnist/fashion_mnist"
[ -x "$exe" ] || { echo "build the example first: cmake --build $build --target fashion_mnist" >&2; exit 1; }
echo "# command: $0 $*   ($(date -u +%F), $(nproc) cores)"
best() { sort -g | tail -1; }
declare -A rates
for ((i = 0; i < repeats; i++)); do
  for ranks in 1 2; do
    rate=$("$exe" --ranks "$ranks" --batch 64 --epochs 1 --schedule constant --lr 0.05 --no-progress |
           sed -n 's/^  throughput *\([0-9.]*\) samples.*/\1/p')
    echo "ranks $ranks: $rate samples/s"
    rates[$ranks]+="$rate "
  done
done
r1=$(tr ' ' '\n' <<<"${rates[1]}" | grep . | best)
r2=$(tr ' ' '\n' <<<"${rates[2]}" | grep . | best)
awk -v a="$r1" -v b="$r2" 'BEGIN { printf "best: 1 rank %.0f samples/s, 2 ranks %.0f samples/s, speed-up %.2fx\n", a, b, b / a }'
