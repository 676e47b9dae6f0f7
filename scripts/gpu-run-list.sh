#!/usr/bin/env bash
# The GPU runs themselves, shared by scripts/gpu-check.sh (from a build tree) and
# gpu-run-bundle.sh (from an unpacked bundle): the GPU test suite, the CUDA kernel and NCCL
# benchmarks, and the example with --device cuda --backend nccl, one in-process rank per GPU, and
# with --mpirun also one process per GPU under mpirun. Every check runs even after one failed;
# the exit status is 1 when any failed.
#   gpu-run-list.sh TESTS KERNELS BENCH EXAMPLE DATA_DIR [--mpirun]   (BENCH: ddp-bench-gpu)
set -uo pipefail
if [ $# -lt 5 ]; then
  echo "usage: $0 TESTS KERNELS BENCH EXAMPLE DATA_DIR [--mpirun]" >&2
  exit 2
fi
tests=$1 kernels=$2 bench=$3 example=$4 data=$5 mpi=${6:-}
failed=()
run() {  # run NAME TIMEOUT COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  local rc=0
  timeout "$limit" "$@" || rc=$?
  if [ $rc != 0 ]; then
    echo "-- $name: exit $rc$([ $rc = 124 ] && echo ", timed out after $limit s")"
    failed+=("$name")
  fi
}
# Every check is bounded and the bounds add up to 300 s: the whole run fits the 5 minutes a lent
# GPU machine gives one command (scripts/gpu-check.sh says how long it took).
# The GPU tests set up NCCL about 20 times (1-2 s each) and move 32 GiB in the timeout case.
run "GPU tests" 110 "$tests"
run "CUDA kernels vs cudaMemcpy (target: >= 85% at >= 64 MiB)" 40 "$kernels" --sizes-mib 64,256,1024 --repeats 20
# NCCL refuses two ranks on one GPU: one rank per GPU, so as many ranks as GPUs.
gpus=$(nvidia-smi -L | wc -l)
run "ddp-bench collective all_reduce over NCCL, one rank per GPU, cudaMemcpy beside it" 40 \
  "$bench" collective all_reduce --backend nccl --ranks "$gpus" -b 8 -e 256M -f 4 -n 20 --out "${DDP_GPU_OUT:-.}/nccl_all_reduce.json"
run "example: $gpus in-process rank(s), one GPU each" 45 "$example" --ranks "$gpus" --epochs 2 --no-progress --data-dir "$data"
# Two ranks on GPU 0 (NCCL refuses that: --backend staged), the trainer's multi-rank logic on one GPU.
run "example: 2 in-process ranks sharing GPU 0 (--backend staged)" 40 "$example" --ranks 2 --backend staged --epochs 1 \
  --no-progress --data-dir "$data"
if [ "$mpi" = --mpirun ] && command -v mpirun >/dev/null 2>&1; then
  run "example: mpirun -np $gpus, one process per GPU" 25 \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$gpus" "$example" --epochs 1 --no-progress --data-dir "$data"
fi
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
