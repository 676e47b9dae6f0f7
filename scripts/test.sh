#!/usr/bin/env bash
# Installs the dependencies, builds everything (the GPU targets only compile: no GPU here)
# and runs the whole test suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${DDP_BUILD_DIR:-build}
# DDP_REQUIRE_MPI: the MPI tests fail (at configure) rather than vanish when MPI is missing.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_REQUIRE_MPI=ON
cmake --build "$build" -j"${DDP_JOBS:-2}"
# The GPU targets (ddp_gpu: GPU tests, GPU benchmark, the example's GPU build) compile and link
# without a GPU; they run in scripts/gpu-check.sh on a machine that has one. Without the CUDA
# toolkit ddp_gpu is empty.
cmake --build "$build" -j"${DDP_JOBS:-2}" --target ddp_gpu
source scripts/openblas-env.sh
ctest --test-dir "$build" -j"${DDP_JOBS:-2}" --output-on-failure "$@"
