#!/usr/bin/env bash
# Runs the GPU checks from a bundle made by scripts/gpu-bundle.sh, on a GPU machine without
# ddp's build dependencies: the GPU test suite, the CUDA kernel and NCCL benchmarks and the example with
# --device cuda --backend nccl (one in-process rank per GPU). Fails, never skips, without a GPU.
# Every step runs under `timeout -k 10 BOUND` and prints its bound and the time it took; the
# bounds add up to at most 300 s (checked before anything runs; docs/testing.md "What the first
# GPU run checks" lists the steps by the numbers below).
# Output goes to stdout and to $OUT/gpu-check.log; the benchmarks' files go to $DDP_GPU_OUT
# (default: $OUT). Without $OUT, both go to out/ beside this script.
# $DDP_GPU_LIB_PATH: folders (colon-separated) searched for CUDA's and NCCL's libraries before the
# usual places.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
export DDP_GPU_OUT=${DDP_GPU_OUT:-$out}
mkdir -p "$DDP_GPU_OUT"
log=$out/gpu-check.log
work=$(mktemp -d)
exec > >(tee "$log") 2>&1
tee_pid=$!
trap 'rm -rf "$work"; exec >&- 2>&-; wait $tee_pid' EXIT  # return only once the log is complete
start=$EPOCHREALTIME
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
fail() {
  echo "gpu-run-bundle: FAILED: $*"
  echo "gpu-run-bundle: stopped after $(since "$start") s"
  exit 1
}

# The bounds, in seconds. The preflight's, then the checks' (gpu-run-list.sh --bounds).
budget=300
b_list_gpus=10 b_driver=5 b_find=20 b_nccl_each=5 nccl_tries=3 b_ldd=5
preflight=$((b_list_gpus + b_driver + b_find + b_nccl_each * nccl_tries + b_ldd))
run_list=("$here/bin/ddp_gpu_test" "$here/bin/gpu_kernels" "$here/bin/ddp-bench-gpu" "$here/bin/fashion_mnist_gpu"
  "$here/data")
checks=$(DDP_GPUS=1 "$here/gpu-run-list.sh" --bounds "${run_list[@]}") || fail "gpu-run-list.sh --bounds did not answer"
echo "gpu-run-bundle: ddp commit $(cat "$here/commit"), $(date -u +'%Y-%m-%d %H:%M UTC')"
echo "gpu-run-bundle: bounds: preflight $preflight s + checks $checks s = $((preflight + checks)) s (at most $budget s)"
((preflight + checks <= budget)) || fail "the steps' bounds add up to $((preflight + checks)) s, over the $budget s a run may take"

# step [--quiet] NAME BOUND COMMAND...: COMMAND under `timeout -k 10 BOUND`; its output is kept
# in $work/step and shown (unless --quiet); the status line gives the time it took and the bound.
# Returns COMMAND's status.
step() {
  local show=1
  [ "$1" = --quiet ] && show=0 && shift
  local name=$1 limit=$2 rc=0 t0=$EPOCHREALTIME
  shift 2
  timeout -k 10 "$limit" "$@" > "$work/step" 2>&1 || rc=$?
  ((show)) && cat "$work/step"
  local outcome="ok"
  ((rc == 124 || rc == 137)) && outcome="timed out"
  ((rc != 0 && rc != 124 && rc != 137)) && outcome="exit $rc"
  echo "## $name: $outcome in $(since "$t0") s (bound $limit s)"
  return $rc
}

# Steps 1-2. A GPU: nvidia-smi must list one; the driver's version.
command -v nvidia-smi > /dev/null 2>&1 || fail "no usable GPU (no nvidia-smi on this machine)"
step "nvidia-smi -L" $b_list_gpus nvidia-smi -L
case $? in
  0) ;;
  124 | 137) fail "no usable GPU (nvidia-smi -L did not answer within $b_list_gpus s)" ;;
  *) fail "no usable GPU (nvidia-smi -L failed)" ;;
esac
gpus=$(grep -c '^GPU ' "$work/step")
((gpus > 0)) || fail "no usable GPU (nvidia-smi lists none)"
export DDP_GPUS=$gpus
step --quiet "driver version" $b_driver nvidia-smi --query-gpu=driver_version --format=csv,noheader
echo "driver (nvidia-smi): $(head -1 "$work/step")"

# Step 3. CUDA's runtime and cuBLAS, and every libnccl.so.2, on this machine: the toolkit, system
# folders, or the NVIDIA Python wheels (PyTorch's environment carries them). One pass of find,
# its output line-buffered so that what it found is kept when its bound stops it.
roots=()
declare -A seen_root=()
IFS=: read -r -a extra <<< "${DDP_GPU_LIB_PATH:-}"
for d in "${extra[@]}" /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /usr/lib64 /opt /usr/local/lib; do
  [ -n "$d" ] && [ -d "$d" ] || continue
  real=$(readlink -f "$d")
  [ -n "${seen_root[$real]:-}" ] && continue
  seen_root[$real]=1
  roots+=("$real/")
done
step "find CUDA's and NCCL's libraries under ${roots[*]}" $b_find \
  stdbuf -oL find "${roots[@]}" \( -name libcudart.so.13 -o -name libcublas.so.13 -o -name libcublasLt.so.13 \
  -o -name libnccl.so.2 \) \( -type f -o -type l \)
case $? in
  0 | 1) ;;  # 1: a folder it could not read
  124 | 137) echo "gpu-run-bundle: find did not finish within $b_find s; going on with what it found" ;;
esac
found=$(grep '^/' "$work/step")
dirs=()
for name in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  lib=$(grep -m1 "/$name\$" <<< "$found") || fail "$name not found on this machine (under ${roots[*]})"
  dirs+=("$(dirname "$lib")")
done
cuda_path="$(printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++' | paste -sd:)"
# Every libnccl.so.2, in the order found, the same file once.
nccl_libs=()
declare -A seen_nccl=()
while IFS= read -r lib; do
  real=$(readlink -f "$lib")
  [ -n "${seen_nccl[$real]:-}" ] && continue
  seen_nccl[$real]=1
  nccl_libs+=("$lib")
done < <(grep '/libnccl\.so\.2$' <<< "$found")
((${#nccl_libs[@]})) || fail "libnccl.so.2 not found on this machine (under ${roots[*]})"
echo "libnccl.so.2 found: ${nccl_libs[*]}"

# Step 4. The versions first: a mismatch between them is the likeliest reason for what follows to
# fail. ddp-bench-gpu versions (no GPU needed) prints the CUDA driver, runtime and NCCL versions it
# loaded and the libraries' paths, and fails when the NCCL is older than the build needs (or the
# runtime newer than the driver). The first NCCL that this build can use is taken: a link to it in
# nccl/ beside this script, a folder of its own ahead of CUDA's on LD_LIBRARY_PATH, so that no
# other libnccl.so.2 (one beside the CUDA runtime, say) comes before it. When none can, the
# checks still run with the first one found (what does not need NCCL is still measured), and
# the run fails at the end, naming every refusal.
mkdir -p "$here/nccl"
chosen=
for ((i = 0; i < ${#nccl_libs[@]} && i < nccl_tries; ++i)); do
  ln -sfn "$(readlink -f "${nccl_libs[$i]}")" "$here/nccl/libnccl.so.2"
  LD_LIBRARY_PATH="$here/lib:$here/nccl:$cuda_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    step "ddp-bench-gpu versions with ${nccl_libs[$i]}" $b_nccl_each "$here/bin/ddp-bench-gpu" versions
  rc=$?
  sed -n 's/^ddp-bench-gpu: FAILED: /  /p' "$work/step" >> "$work/refused"
  if [ $rc = 0 ]; then
    chosen=${nccl_libs[$i]}
    nccl_loaded=$(sed -n 's|^loaded: \(.*/libnccl[^/]*\)$|\1|p' "$work/step" | head -1)
    break
  fi
  ((rc == 124 || rc == 137)) && echo "  ${nccl_libs[$i]}: ddp-bench-gpu versions did not answer within $b_nccl_each s" >> "$work/refused"
  ((rc != 124 && rc != 137 && rc != 1)) && echo "  ${nccl_libs[$i]}: ddp-bench-gpu versions could not start (exit $rc, above)" >> "$work/refused"
done
refused=
if [ -z "$chosen" ]; then
  ((${#nccl_libs[@]} > nccl_tries)) && echo "not tried (only the first $nccl_tries are): ${nccl_libs[*]:$nccl_tries}"
  refused="ddp-bench-gpu versions refused every libnccl.so.2 it tried:
$(cat "$work/refused")"
  echo "gpu-run-bundle: FAILED (the checks still run, with ${nccl_libs[0]}): $refused"
  chosen=${nccl_libs[0]}
  ln -sfn "$(readlink -f "$chosen")" "$here/nccl/libnccl.so.2"
  nccl_loaded=$(readlink -f "$chosen")
fi
export LD_LIBRARY_PATH="$here/lib:$here/nccl:$cuda_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
echo "NCCL loaded: ${nccl_loaded:-unknown} (NCCL $(sed -n 's/^CUDA driver .*, NCCL //p' "$work/step"), found as $chosen)"
source "$here/openblas-env.sh"  # the host reference paths of the tests use OpenBLAS
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"

# Step 5. The test binary resolves the same libraries (its RUNPATH names the build machine's folders,
# which LD_LIBRARY_PATH precedes) and none is missing.
step --quiet "ldd ddp_gpu_test" $b_ldd ldd "$here/bin/ddp_gpu_test" || fail "ldd could not read ddp_gpu_test"
grep -E "not found|cuda|cublas|nccl|openblas|gfortran" "$work/step"
! grep -q "not found" "$work/step" || fail "ddp_gpu_test needs libraries this machine lacks (not found, above)"
test_nccl=$(sed -n 's|^\s*libnccl\.so\.2 => \(/[^ ]*\) .*|\1|p' "$work/step")
if [ -n "${nccl_loaded:-}" ] && [ "$(readlink -f "$test_nccl")" != "$(readlink -f "$nccl_loaded")" ]; then
  fail "ddp_gpu_test would load ${test_nccl:-no libnccl.so.2}, not the $nccl_loaded checked above"
fi

# Steps 6-10. The checks (scripts/gpu-run-list.sh): every one runs even after one failed.
echo "gpu-run-bundle: preflight done in $(since "$start") s"
"$here/gpu-run-list.sh" "${run_list[@]}"
rc=$?
echo "gpu-run-bundle: took $(since "$start") s (bounds: $((preflight + checks)) s); files in $DDP_GPU_OUT: $(cd "$DDP_GPU_OUT" && ls | paste -sd' ')"
[ -z "$refused" ] || fail "$refused"
[ $rc = 0 ] || fail "a check failed (see above)"
echo "gpu-run-bundle: all GPU checks passed"
