#!/usr/bin/env bash
# The benchmark figures of docs/results.md ("ddp-bench"), regenerated: runs ddp-bench's
# subcommands and the example with --trace on this machine, keeps their JSON in docs/figures/ and
# draws the plots there (bench/plot.py; Debian's python3-matplotlib).
#   scripts/bench-plots.sh [build dir]      (build it first: cmake --build build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=docs/figures
mkdir -p "$out"
bench="$build/bench/ddp-bench"
[ -x "$bench" ] || { echo "build ddp-bench first: cmake --build $build --target ddp-bench" >&2; exit 1; }
py=${PYTHON:-/usr/bin/python3}  # Debian's, where python3-matplotlib installs
"$py" -c 'import matplotlib' 2>/dev/null || { echo "needs matplotlib: apt-get install python3-matplotlib" >&2; exit 1; }
source scripts/openblas-env.sh
"$bench" collective all_reduce --backend inproc --ranks 2 -b 4K -e 64M -f 4 -n 50 --out "$out/all_reduce_inproc.json"
if command -v mpirun >/dev/null; then
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
    "$bench" collective all_reduce --backend mpi -b 4K -e 64M -f 4 -n 50 --out "$out/all_reduce_mpi.json"
fi
"$bench" step --ranks 1,2 --params 1.3M --steps 40 --repeats 5 --out "$out/step.json"
"$bench" scaling --ranks 2 --rounds 9 --steps 80 --out "$out/scaling.json"
# The trace of a whole epoch is 0.8 MB: kept out of the repository.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
trace=$scratch/fashion_mnist_trace.json
"$build/examples/fashion_mnist/fashion_mnist" --epochs 1 --no-progress --trace "$trace"
"$py" bench/plot.py collective "$out/all_reduce.png" "$out"/all_reduce_*.json
"$py" bench/plot.py step "$out/step.png" "$out/step.json"
"$py" bench/plot.py trace "$out/trace_overlap.png" "$trace"
