#!/usr/bin/env bash
# The main job: installs the dependencies, builds the Fashion-MNIST example and trains it
# data-parallel on in-process ranks (CPU). Extra arguments go to the example (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${DDP_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j"${DDP_JOBS:-2}" --target fashion_mnist
source scripts/openblas-env.sh
exec "$build/examples/fashion_mnist/fashion_mnist" "$@"
