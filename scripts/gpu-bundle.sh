#!/usr/bin/env bash
# Packs the GPU checks for a GPU machine that has the NVIDIA driver, CUDA 13 and NCCL libraries
# but no compiler toolchain for ddp's dependencies and no network (an H200 host, say):
# builds the ddp_gpu targets here (MPI off: that machine has no OpenMPI), then writes
# .gpu-bundle/ddp-gpu.tar.xz with the GPU binaries, the non-CUDA shared libraries they need
# (OpenBLAS and its Fortran runtime), the Fashion-MNIST files, scripts/gpu-run-bundle.sh and
# scripts/gpu-run-list.sh.
# On the GPU machine: mkdir -p /tmp/g && tar xf ddp-gpu.tar.xz -C /tmp/g && /tmp/g/gpu-run-bundle.sh
#   scripts/gpu-bundle.sh [build-dir]     (default build-gpu-bundle; about 4 minutes on 2 cores)
#   scripts/gpu-bundle.sh --from BUILD --dir DIR
#       packs the ddp_gpu targets already built in BUILD into the directory DIR, unpacked and
#       without building or installing anything (tests/cuda/no_gpu.sh runs such a bundle here).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-gpu-bundle from= dir=
while [ $# -gt 0 ]; do
  case $1 in
    --from) from=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) build=$1; shift ;;
  esac
done
out=.gpu-bundle
if [ -n "$from" ]; then
  build=$from
else
  scripts/install-deps.sh
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_WITH_MPI=OFF -DDDP_BUILD_TESTS=ON \
    -DDDP_BUILD_EXAMPLES=ON -DDDP_BUILD_BENCHMARKS=ON >/dev/null
  cmake --build "$build" -j"${DDP_JOBS:-2}" --target ddp_gpu
fi

if [ -n "$dir" ]; then
  stage=$dir
  mkdir -p "$stage"
else
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
fi
mkdir -p "$stage/bin" "$stage/lib" "$stage/data"
cp "$build/tests/ddp_gpu_test" "$build/bench/gpu_kernels" "$build/bench/ddp-bench-gpu" \
  "$build/examples/fashion_mnist/fashion_mnist_gpu" "$stage/bin/"
# Shared libraries outside glibc/libstdc++ and outside CUDA (the GPU machine brings its own CUDA,
# cuBLAS and NCCL, matched to its driver).
for exe in "$stage"/bin/*; do
  ldd "$exe" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libgcc_s.so*|libstdc++.so*) ;;
    libcudart*|libcublas*|libnccl*|libcuda.so*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
cp /usr/share/datasets/fashion-mnist/*.gz "$stage/data/"
cp scripts/gpu-run-bundle.sh scripts/gpu-run-list.sh scripts/openblas-env.sh "$stage/"
# The commit, "-dirty" when the working tree had changes: the bundle may hold them.
git describe --always --dirty --abbrev=7 > "$stage/commit" 2>/dev/null || echo unknown > "$stage/commit"
[ -n "$dir" ] && { echo "bundle in $dir; run $dir/gpu-run-bundle.sh"; exit 0; }
mkdir -p "$out"
tar -C "$stage" -cJf "$out/ddp-gpu.tar.xz" .
ls -la "$out/ddp-gpu.tar.xz"
echo "carry $out to the GPU machine; there: mkdir -p /tmp/g && tar xf $out/ddp-gpu.tar.xz -C /tmp/g && /tmp/g/gpu-run-bundle.sh"
