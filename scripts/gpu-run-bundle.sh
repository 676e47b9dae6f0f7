#!/usr/bin/env bash
# Runs the GPU checks from a bundle made by scripts/gpu-bundle.sh, on a GPU machine without
# ddp's build dependencies: the GPU test suite, the CUDA kernel and NCCL benchmarks and the example with
# --device cuda --backend nccl (one in-process rank per GPU). Fails, never skips, without a GPU.
# Output goes to stdout and, when $OUT is set, to $OUT/gpu-check.log.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log=${OUT:-$here}/gpu-check.log
exec > >(tee "$log") 2>&1
tee_pid=$!
trap 'exec >&- 2>&-; wait $tee_pid' EXIT  # return only once the log is complete
echo "gpu-run-bundle: ddp commit $(cat "$here/commit"), $(date -u +'%Y-%m-%d %H:%M UTC')"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
  echo "gpu-run-bundle: FAILED: no usable GPU (nvidia-smi lists none)"
  exit 1
fi
# CUDA runtime, cuBLAS and NCCL from this machine: the toolkit, system folders, or the NVIDIA
# Python wheels (PyTorch's environment carries them).
dirs=()
for pattern in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  found=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -name "$pattern" 2>/dev/null | head -1)
  if [ -z "$found" ]; then
    echo "gpu-run-bundle: FAILED: $pattern not found on this machine"
    exit 1
  fi
  dirs+=("$(dirname "$found")")
done
export LD_LIBRARY_PATH="$here/lib:$(printf '%s\n' "${dirs[@]}" | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
# The versions first: a mismatch between them is the likeliest reason for what follows to fail.
echo "driver (nvidia-smi): $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
"$here/bin/ddp-bench-gpu" versions || echo "gpu-run-bundle: ddp-bench-gpu could not start (see above)"
source "$here/openblas-env.sh"  # the host reference paths of the tests use OpenBLAS
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
ldd "$here/bin/ddp_gpu_test" | grep -E "not found|cuda|cublas|nccl|openblas"

if ! "$here/gpu-run-list.sh" "$here/bin/ddp_gpu_test" "$here/bin/gpu_kernels" "$here/bin/ddp-bench-gpu" \
    "$here/bin/fashion_mnist_gpu" "$here/data"; then
  echo "gpu-run-bundle: FAILED (see above)"
  exit 1
fi
echo "gpu-run-bundle: all GPU checks passed"
