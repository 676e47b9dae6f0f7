#!/usr/bin/env bash
# Every GPU check in one go, on a machine with a GPU: builds the ddp_gpu target (GPU tests,
# GPU benchmarks, the example's GPU build), runs the GPU tests (ctest label gpu), the kernel
# benchmarks and the example on the GPU (in-process, and under mpirun when OpenMPI is there).
# Fails, never skips, when no GPU is visible. Everything it prints is also kept in
# $build/gpu-check.log (the GPU figures: scripts/results.sh measures the host's).
#   scripts/gpu-check.sh [build-dir]        (default build-gpu; about 5 minutes on one H200)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
mkdir -p "$build"
exec > >(tee "$build/gpu-check.log") 2>&1
tee_pid=$!
trap 'exec >&- 2>&-; wait $tee_pid' EXIT  # return only once the log is complete

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: FAILED: no usable GPU (nvidia-smi lists none). This script runs the GPU tests and"
  echo "benchmarks and must fail without a GPU; the host suite is ./scripts/test.sh."
  exit 1
fi
date -u +"gpu-check: %Y-%m-%d %H:%M UTC"
nvidia-smi -L
# Debian packages; a GPU machine without network may already have them.
scripts/install-deps.sh || echo "gpu-check: could not install packages; going on with what is installed"
export PATH=/usr/local/cuda/bin:$PATH

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_GPU_TESTS=ON
cmake --build "$build" -j"$(nproc)" --target ddp_gpu

source scripts/openblas-env.sh
export DDP_GPU_OUT=$build  # the benchmarks' files: gpu_kernels.csv, nccl_all_reduce.json
scripts/gpu-run-list.sh "$build/tests/ddp_gpu_test" "$build/bench/gpu_kernels" "$build/bench/ddp-bench-gpu" \
  "$build/examples/fashion_mnist/fashion_mnist_gpu" /usr/share/datasets/fashion-mnist --mpirun ||
  { echo "gpu-check: FAILED (see above)"; exit 1; }
echo "gpu-check: all GPU checks passed"
