#!/usr/bin/env bash
# Installs the dependencies, builds everything (the GPU targets only compile: no GPU here)
# and runs the whole test suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${DDP_BUILD_DIR:-build}
# DDP_REQUIRE_MPI: the MPI tests fail (at configure) rather than vanish when MPI is missing.
# The GPU targets (ddp_gpu: GPU tests, GPU benchmarks, the example's GPU build) are not part of
# this run: they need no GPU to compile, and CI compiles them after it (.ci/run builds ddp_gpu);
# scripts/gpu-check.sh runs them on a machine with a GPU.
# DDP_REQUIRE_TORCH: likewise for libtorch and the ddp::torch tests.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_REQUIRE_MPI=ON -DDDP_REQUIRE_TORCH=ON -DDDP_GPU_IN_ALL=OFF
cmake --build "$build" -j"${DDP_JOBS:-2}"
source scripts/openblas-env.sh
ctest --test-dir "$build" -j"${DDP_JOBS:-2}" --output-on-failure "$@"
