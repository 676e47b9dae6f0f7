#!/usr/bin/env bash
# The GPU runs themselves, shared by scripts/gpu-check.sh (from a build tree) and
# gpu-run-bundle.sh (from an unpacked bundle): the GPU test suite, the CUDA kernel and NCCL
# benchmarks, and the example with --device cuda --backend nccl, one in-process rank per GPU, and
# with --mpirun also one process per GPU under mpirun. Every check runs even after one failed,
# each under `timeout -k 10 BOUND`; each prints its bound and the time it took. The exit status
# is 1 when any failed: a non-zero exit, a timeout, or a benchmark that did not write its file.
#   gpu-run-list.sh [--bounds] TESTS KERNELS BENCH EXAMPLE DATA_DIR [--mpirun]   (BENCH: ddp-bench-gpu)
# --bounds: print the sum of the checks' bounds in seconds and run nothing.
# The benchmarks write their files (gpu_kernels.csv, nccl_all_reduce.json) to $DDP_GPU_OUT
# (default: the current directory). $DDP_GPUS: the GPUs to use (default: what nvidia-smi -L lists,
# asked under a bound of its own).
set -uo pipefail
mode=run
if [ "${1:-}" = --bounds ]; then
  mode=bounds
  shift
fi
if [ $# -lt 5 ]; then
  echo "usage: $0 [--bounds] TESTS KERNELS BENCH EXAMPLE DATA_DIR [--mpirun]" >&2
  exit 2
fi
tests=$1 kernels=$2 bench=$3 example=$4 data=$5 mpi=${6:-}
out=${DDP_GPU_OUT:-$PWD}
total=0
failed=()
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
run() {  # run NAME BOUND [--writes FILE] COMMAND...
  local name=$1 limit=$2 writes=
  shift 2
  if [ "$1" = --writes ]; then
    writes=$2
    shift 2
  fi
  total=$((total + limit))
  [ $mode = bounds ] && return 0
  echo "== $name (bound $limit s)"
  [ -n "$writes" ] && rm -f "$writes"
  local rc=0 t0=$EPOCHREALTIME
  timeout -k 10 "$limit" "$@" || rc=$?
  local took
  took=$(since "$t0")
  if [ $rc != 0 ]; then
    echo "-- $name: FAILED, exit $rc after $took s (bound $limit s)$( ((rc == 124 || rc == 137)) && echo ": timed out")"
    failed+=("$name")
  elif [ -n "$writes" ] && [ ! -s "$writes" ]; then
    echo "-- $name: FAILED, exit 0 after $took s (bound $limit s), but it did not write $writes"
    failed+=("$name")
  else
    echo "-- $name: passed in $took s (bound $limit s)${writes:+, wrote $writes}"
  fi
}
# Every check is bounded. With gpu-run-bundle.sh's preflight, the bounds add up to 300 s
# (gpu-run-bundle.sh checks the sum, docs/testing.md lists them): the whole run fits well inside
# 10 minutes for one command.
start=$EPOCHREALTIME
if [ -z "${DDP_GPUS:-}" ]; then
  total=$((total + 10))
  [ $mode = run ] && DDP_GPUS=$(timeout -k 10 10 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
gpus=${DDP_GPUS:-1}
[ "$gpus" -ge 1 ] 2>/dev/null || gpus=1  # none listed: the checks say why themselves
[ $mode = run ] && mkdir -p "$out"
# The GPU tests set up NCCL about 20 times (1-2 s each) and move 32 GiB in the timeout case.
run "GPU tests" 100 "$tests"
run "CUDA kernels vs cudaMemcpy (target: >= 85% at >= 64 MiB), each result checked" 40 \
  --writes "$out/gpu_kernels.csv" "$kernels" --sizes-mib 64,256,1024 --repeats 20 --out "$out/gpu_kernels.csv"
# NCCL refuses two ranks on one GPU: one rank per GPU, so as many ranks as GPUs.
run "ddp-bench collective all_reduce over NCCL, one rank per GPU, cudaMemcpy beside it" 25 \
  --writes "$out/nccl_all_reduce.json" \
  "$bench" collective all_reduce --backend nccl --ranks "$gpus" -b 8 -e 256M -f 4 -n 20 --out "$out/nccl_all_reduce.json"
run "example: $gpus in-process rank(s), one GPU each" 45 "$example" --ranks "$gpus" --epochs 2 --no-progress --data-dir "$data"
# Two ranks on GPU 0 (NCCL refuses that: --backend staged), the trainer's multi-rank logic on one GPU.
run "example: 2 in-process ranks sharing GPU 0 (--backend staged)" 35 "$example" --ranks 2 --backend staged --epochs 1 \
  --no-progress --data-dir "$data"
if [ "$mpi" = --mpirun ] && command -v mpirun >/dev/null 2>&1; then
  run "example: mpirun -np $gpus, one process per GPU" 25 \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$gpus" "$example" --epochs 1 --no-progress --data-dir "$data"
fi
if [ $mode = bounds ]; then
  echo "$total"
  exit 0
fi
echo "gpu-run-list: the checks took $(since "$start") s (their bounds sum to $total s)"
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
