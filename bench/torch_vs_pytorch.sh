#!/usr/bin/env bash
# ddp::torch against PyTorch's own DistributedDataParallel (Python, gloo), side by side in one run:
# the CNN of examples/torch_fashion_mnist, the same hyper-parameters, ranks, batch and epochs, one
# intra-op thread per rank in both. Prints samples/s of training (the epochs' own figures, without
# the test-set evaluation) and the test accuracy of each, and their ratio.
#   bench/torch_vs_pytorch.sh [build-dir] [epochs] [ranks]
# Needs Debian's python3-torch (apt-get install python3-torch) for the baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
epochs=${2:-1}
ranks=${3:-2}
source scripts/openblas-env.sh
export OPENBLAS_NUM_THREADS=1  # both: Debian's libtorch calls OpenBLAS, whose idle pool spins
echo "# command: bench/torch_vs_pytorch.sh $build $epochs $ranks   ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores)"
ours=$("$build/examples/torch_fashion_mnist/torch_fashion_mnist" --ranks "$ranks" --epochs "$epochs" --batch 64 \
       --lr 0.1 --weight-decay 0 --no-progress)
ddp_rate=$(echo "$ours" | sed -n 's/^epoch .* s, \([0-9]*\) samples\/s$/\1/p' | awk '{s += $1} END {printf "%.0f", s / NR}')
ddp_acc=$(echo "$ours" | sed -n 's/^  test accuracy *\([0-9.]*\)%.*/\1/p')
# The same binary with one process per rank, as PyTorch's DDP runs.
mpi=$(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" \
      "$build/examples/torch_fashion_mnist/torch_fashion_mnist" --epochs "$epochs" --batch 64 --lr 0.1 \
      --weight-decay 0 --no-progress)
mpi_rate=$(echo "$mpi" | sed -n 's/^epoch .* s, \([0-9]*\) samples\/s$/\1/p' | awk '{s += $1} END {printf "%.0f", s / NR}')
mpi_acc=$(echo "$mpi" | sed -n 's/^  test accuracy *\([0-9.]*\)%.*/\1/p')
# The ceiling: `ranks` independent one-rank trainings at once (each a whole epoch at batch 64, no
# synchronisation at all); the sum of their samples/s is what this machine gives the model.
ceiling=$(for r in $(seq "$ranks"); do
  "$build/examples/torch_fashion_mnist/torch_fashion_mnist" --ranks 1 --epochs "$epochs" --batch 64 --lr 0.1 \
    --weight-decay 0 --no-progress &
done; wait)
ceil_rate=$(echo "$ceiling" | sed -n 's/^epoch .* s, \([0-9]*\) samples\/s$/\1/p' | awk '{s += $1} END {printf "%.0f", s * '"$ranks"' / NR}')
theirs=$(/usr/bin/python3 bench/torch_vs_pytorch.py --ranks "$ranks" --epochs "$epochs" --batch 64 --lr 0.1)
py_rate=$(echo "$theirs" | sed -n 's/.*samples\/s \([0-9]*\) .*/\1/p')
py_acc=$(echo "$theirs" | sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p')
# PyTorch with the allocator settings ddp::torch::retain_freed_memory() makes (glibc's variables).
theirs_kept=$(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864 \
  /usr/bin/python3 bench/torch_vs_pytorch.py --ranks "$ranks" --epochs "$epochs" --batch 64 --lr 0.1)
pyk_rate=$(echo "$theirs_kept" | sed -n 's/.*samples\/s \([0-9]*\) .*/\1/p')
pyk_acc=$(echo "$theirs_kept" | sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p')
printf "%-28s %12s %14s\n" "" "samples/s" "test accuracy"
printf "%-28s %12s %13s%%\n" "ddp::torch, in-process" "$ddp_rate" "$ddp_acc"
printf "%-28s %12s %13s%%\n" "ddp::torch, mpirun" "$mpi_rate" "$mpi_acc"
printf "%-28s %12s %13s%%\n" "PyTorch DDP (Python, gloo)" "$py_rate" "$py_acc"
printf "%-28s %12s %13s%%\n" "  same, freed memory kept" "$pyk_rate" "$pyk_acc"
printf "%-28s %12s %14s\n" "ceiling: $ranks x 1 rank, no sync" "$ceil_rate" "-"
awk -v a="$ddp_rate" -v m="$mpi_rate" -v b="$py_rate" -v k="$pyk_rate" -v c="$ceil_rate" \
  'BEGIN { printf "ddp::torch / PyTorch DDP samples/s: %.2fx in-process, %.2fx under mpirun (%.2fx, %.2fx against PyTorch with freed memory kept)\n", a / b, m / b, a / k, m / k;
           printf "share of the ceiling: ddp::torch %.0f%% in-process, %.0f%% under mpirun; PyTorch DDP %.0f%% (%.0f%% with freed memory kept); 2x PyTorch DDP would be %.0f%% of it\n", 100 * a / c, 100 * m / c, 100 * b / c, 100 * k / c, 200 * b / c }'
