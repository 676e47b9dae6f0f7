#!/usr/bin/env bash
# The character-level GPT three ways, side by side in one run: ddp::nn (examples/char_gpt),
# ddp::torch (examples/char_gpt_torch: libtorch's layers) and PyTorch's own DistributedDataParallel
# (bench/gpt_pytorch.py: Python, gloo, one process per rank). The same model, corpus split,
# sequences, recipe (AdamW, warm-up then cosine, clipping at 1.0) and seed, one intra-op thread
# per rank everywhere.
#   1. Throughput: tokens/s of the training steps (evaluation not counted) at 1 and 2 ranks, the
#      three alternated in each of --rounds rounds (medians), and the ratios to PyTorch.
#   2. Validation loss after the same number of steps at 2 ranks, over 3 seeds (mean), ddp::nn
#      and ddp::torch against PyTorch (the kernels differ: not bitwise).
#   bench/gpt_vs_pytorch.sh [build-dir] [throughput steps] [rounds] [validation steps] [seeds] [validated]
# `validated`: the implementations of part 2 (default "nn th py"); a rounds of 0 skips part 1, a
# validation steps of 0 part 2. Each run's figure goes to stderr as it comes.
# Needs Debian's python3-torch (apt-get install python3-torch) for the baseline, and a build
# configured with -DDDP_WITH_TORCH=ON for char_gpt_torch.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-60}
rounds=${3:-2}
val_steps=${4:-300}
seeds=${5:-"1 2 3"}
validated=${6:-"nn th py"}
source scripts/openblas-env.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1  # one thread per rank: the ranks are the parallelism
nn="$build/examples/char_gpt/char_gpt"
th="$build/examples/char_gpt_torch/char_gpt_torch"
for b in "$nn" "$th"; do
  [[ -x $b ]] || { echo "no $b: build it (cmake --build $build --target char_gpt char_gpt_torch)" >&2; exit 1; }
done
# The example's recipe, spelled out for all three.
recipe="--batch 12 --context 64 --layers 4 --heads 4 --width 128 --lr 1e-3 --min-lr 1e-4 --warmup 100 \
--weight-decay 0.1 --beta2 0.99 --clip 1.0"
echo "# command: bench/gpt_vs_pytorch.sh $build $steps $rounds $val_steps \"$seeds\" \"$validated\"   ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
echo "# recipe: $recipe"

rate() { sed -n 's/.*throughput *\([0-9.]*\) tokens\/s.*/\1/p; s/.*tokens\/s \([0-9.]*\) validation.*/\1/p'; }
loss() { sed -n 's/.*validation loss \([0-9.]*\) nats.*/\1/p; s/.*tokens\/s [0-9.]* validation loss \([0-9.]*\).*/\1/p'; }
run_nn() { "$nn" --ranks "$1" --steps "$2" --seed "$3" $recipe --eval-every 0 --final-eval-sequences "$4" \
             --sample-chars 0 --log-every 0 --no-progress; }
run_th() { "$th" --ranks "$1" --steps "$2" --seed "$3" $recipe --eval-every 0 --final-eval-sequences "$4" --log-every 0; }
run_py() { /usr/bin/python3 bench/gpt_pytorch.py --ranks "$1" --steps "$2" --seed "$3" $recipe --eval-every 0 \
             --final-eval-sequences "$4"; }
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR] = $1} END {print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }

name() { case $1 in nn) echo "ddp::nn (char_gpt)";; th) echo "ddp::torch (char_gpt_torch)";; py) echo "PyTorch DDP (Python, gloo)";; esac; }

# 1. Throughput, alternated: each round runs the three at 1 rank, then at 2, in rotating order.
if (( rounds > 0 )); then
declare -A rates
impls=(nn th py)
for r in $(seq "$rounds"); do
  for ranks in 1 2; do
    for k in 0 1 2; do
      impl=${impls[$(( (k + r) % 3 ))]}
      out=$(run_$impl "$ranks" "$steps" 1 64)
      rates[$impl,$ranks]="${rates[$impl,$ranks]:-} $(echo "$out" | rate)"
      echo "round $r, $ranks rank(s), $impl: $(echo "$out" | rate) tokens/s" >&2
    done
  done
done
printf "\n%-34s %14s %14s %10s\n" "tokens/s ($steps steps, median of $rounds)" "1 rank" "2 ranks" "2 / 1"
declare -A med
for impl in nn th py; do
  for ranks in 1 2; do med[$impl,$ranks]=$(echo "${rates[$impl,$ranks]}" | median); done
done
for impl in nn th py; do
  printf "%-34s %14.0f %14.0f %9.2fx   (runs: 1 rank%s; 2 ranks%s)\n" "$(name $impl)" "${med[$impl,1]}" "${med[$impl,2]}" \
    "$(awk -v a="${med[$impl,2]}" -v b="${med[$impl,1]}" 'BEGIN {print a / b}')" "${rates[$impl,1]}" "${rates[$impl,2]}"
done
awk -v n1="${med[nn,1]}" -v n2="${med[nn,2]}" -v t1="${med[th,1]}" -v t2="${med[th,2]}" -v p1="${med[py,1]}" -v p2="${med[py,2]}" \
  'BEGIN { printf "ratio to PyTorch DDP: ddp::nn %.2fx at 1 rank, %.2fx at 2 ranks; ddp::torch %.2fx at 1 rank, %.2fx at 2 ranks\n",
           n1 / p1, n2 / p2, t1 / p1, t2 / p2 }'
fi
(( val_steps > 0 )) || exit 0

# 2. Validation loss after $val_steps steps at 2 ranks, every validation sequence, per seed.
printf "\n%-34s" "validation loss, $val_steps steps, 2 ranks"
for s in $seeds; do printf " %9s" "seed $s"; done
printf " %9s\n" "mean"
declare -A losses
for s in $seeds; do
  for impl in $validated; do
    v=$(run_$impl 2 "$val_steps" "$s" 0 | loss)
    echo "seed $s, $impl: validation loss $v" >&2
    losses[$impl]="${losses[$impl]:-} $v"
  done
done
declare -A means
for impl in $validated; do
  printf "%-34s" "$(name $impl)"
  for v in ${losses[$impl]}; do printf " %9.4f" "$v"; done
  means[$impl]=$(echo "${losses[$impl]}" | tr ' ' '\n' | sed '/^$/d' | awk '{s += $1} END {printf "%.4f", s / NR}')
  printf " %9s\n" "${means[$impl]}"
done
for impl in $validated; do
  [[ $impl == py || -z ${means[py]:-} ]] && continue
  awk -v a="${means[$impl]}" -v p="${means[py]}" -v n="$(name $impl)" \
    'BEGIN { printf "mean validation loss minus PyTorch DDP'"'"'s: %s %+.4f\n", n, a - p }'
done
