#!/usr/bin/env bash
# Installs the dependencies, builds everything (the CUDA/NCCL target only compiles: no GPU here)
# and runs the whole test suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${DDP_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"${DDP_JOBS:-2}"
ctest --test-dir "$build" -j"${DDP_JOBS:-2}" --output-on-failure "$@"
