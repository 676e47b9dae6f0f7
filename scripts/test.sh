#!/usr/bin/env bash
# Installs the dependencies, builds everything (the GPU targets only compile: no GPU here)
# and runs the whole test suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${DDP_BUILD_DIR:-build}
# DDP_REQUIRE_MPI: the MPI tests fail (at configure) rather than vanish when MPI is missing.
# DDP_GPU_IN_ALL: the GPU targets (ddp_gpu: GPU tests, GPU benchmarks, the example's GPU build)
# build with everything else, in one build that keeps both cores busy; they compile and link
# without a GPU and run in scripts/gpu-check.sh on a machine that has one (without the CUDA
# toolkit ddp_gpu is empty).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_REQUIRE_MPI=ON -DDDP_GPU_IN_ALL=ON
cmake --build "$build" -j"${DDP_JOBS:-2}"
source scripts/openblas-env.sh
ctest --test-dir "$build" -j"${DDP_JOBS:-2}" --output-on-failure "$@"
