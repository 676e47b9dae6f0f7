#!/usr/bin/env bash
# docs/results.md, measured and written by one command: runs the side-by-side measurements in
# turn on this machine, keeps each one's JSON (command, date, machine, load average) in
# docs/figures/, redraws the plots there (bench/plot.py, where matplotlib is installed) and
# writes docs/results.md from scripts/results.md.in (scripts/results.py fills it in and checks
# that the page parses).
#
#   scripts/results.sh [--quick] [--with-build] [--render-only] [BUILD_DIR] [--out DIR]
#
#   BUILD_DIR     the build to measure (default: build). Needs ddp-bench and fashion_mnist
#                 (cmake --build build --target ddp-bench fashion_mnist); host_kernels,
#                 fashion_mnist_mpi and torch_fashion_mnist are measured where they are built.
#   --out DIR     write DIR/results.md and DIR/figures/ instead of docs/.
#   --quick       the smallest sizes (seconds in all; the example on a 1,280-image slice of
#                 Fashion-MNIST), into a temporary directory unless --out is given, never into
#                 docs/: checks that the measurements, the generator and the page's checks run.
#                 ctest runs it (results_quick).
#   --with-build  also times the example's build after configure (its sources touched, then
#                 cmake --build BUILD_DIR --target fashion_mnist). Off by default: it compiles.
#   --render-only measures nothing: writes the page again from the figures already in DIR/figures
#                 (after an edit of scripts/results.md.in).
#
# The test command's stage times are not measured here (a full build and test run takes many
# minutes): scripts/test.sh writes them to BUILD_DIR/test-times.txt, and the page shows the
# latest such record it finds there (or keeps the one already in docs/figures/).
#
# The full run takes about 10 minutes on 2 cores (and --with-build one or two more); every figure
# of a section is measured in the same run, so its ratios compare the same moments of a shared
# machine. Sizes and repeats are chosen to fit that time, and are written in the commands below.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0 with_build=0 render_only=0 build=build out=
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --with-build) with_build=1 ;;
    --render-only) render_only=1 ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    -*) echo "results.sh: unknown flag $1" >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if [ -z "$out" ]; then
  if [ $quick = 1 ]; then out=$scratch/out; else out=docs; fi
elif [ $quick = 1 ] && [ "$(realpath -m "$out")" = "$(realpath docs)" ]; then
  echo "results.sh: --quick never writes into docs/ (its figures are the smallest sizes)" >&2; exit 2
fi
figs=$out/figures
mkdir -p "$figs"
py=/usr/bin/python3  # Debian's, where python3-matplotlib installs
results() { "$py" scripts/results.py "$@"; }
if [ $render_only = 1 ]; then
  results render scripts/results.md.in "$figs" "$out/results.md"
  results check "$out/results.md" .
  exit
fi
bench=$build/bench/ddp-bench
example=$build/examples/fashion_mnist/fashion_mnist
for need in "$bench" "$example"; do
  [ -x "$need" ] || { echo "results.sh: build $need first: cmake --build $build --target ddp-bench fashion_mnist" >&2; exit 1; }
done
source scripts/openblas-env.sh
mpirun=()
if command -v mpirun > /dev/null; then mpirun=(mpirun --allow-run-as-root --oversubscribe -np); fi
# Each measurement: NAME KIND [--exit N] -- COMMAND... (scripts/results.py measure)
measure() { results measure "$figs" "$@"; }
skip() { results skip "$figs" "$@"; }
# The figures of the last full run stay until this one replaces them; a --quick run starts empty.
[ $quick = 1 ] && rm -f "$figs"/*.json "$figs"/*.png

# The sizes: --quick the smallest that still run every path, else the page's.
if [ $quick = 1 ]; then
  sweep=(-b 4K -e 16K -f 4 -n 2 -w 1 --repeats 1)
  step=(--params 20K --steps 2 --repeats 1)
  scaling=(--rounds 1 --steps 2)
  invariance=(--steps 5 --hidden 64)
  invariance_ranks=1,2 mpi_worlds="1 2" lose_at=1@2 rejoin_after=2
  epochs=(--epochs 1) one_epoch=(--epochs 1)
  # A slice of the real data set (1,280 training and 256 test images), so that an epoch is 10 steps.
  "$py" - "$scratch/fm" <<'EOF'
import gzip, os, struct, sys
src, dst = "/usr/share/datasets/fashion-mnist", sys.argv[1]
os.makedirs(dst, exist_ok=True)
for split, n in (("train", 1280), ("t10k", 256)):
    for kind, header in (("images-idx3", ">IIII"), ("labels-idx1", ">II")):
        with gzip.open(f"{src}/{split}-{kind}-ubyte.gz") as f:
            data = f.read()
        fields = list(struct.unpack(header, data[:struct.calcsize(header)]))
        per = 1 if kind.startswith("labels") else fields[2] * fields[3]
        fields[1] = n
        with gzip.open(f"{dst}/{split}-{kind}-ubyte.gz", "wb", compresslevel=1) as g:
            g.write(struct.pack(header, *fields) + data[struct.calcsize(header):struct.calcsize(header) + n * per])
EOF
  data=(--data-dir "$scratch/fm")
  kernels=(--benchmark_filter='bm_memcpy/65536|bm_sgd/65536' --benchmark_min_time=0.01)
else
  sweep=(-b 4K -e 64M -f 4 -n 50 --repeats 5)
  step=(--params 1.3M --steps 30 --repeats 5)
  scaling=(--rounds 15 --steps 80)
  invariance=(--steps 50)
  invariance_ranks=1,2,3,4,6,8 mpi_worlds="1 2 3 4" lose_at=1@20 rejoin_after=10
  epochs=() one_epoch=(--epochs 1)
  data=()
  kernels=(--benchmark_filter='memcpy|scale|pack|sgd|adamw|narrow|widen' --benchmark_min_time=0.2)
fi

echo "== collectives"
measure all_reduce_inproc bench -- "$bench" collective all_reduce --backend inproc --ranks 2 "${sweep[@]}" \
  --out "$figs/all_reduce_inproc.json"
measure all_reduce_inproc_bound bench -- "$bench" collective all_reduce --backend inproc --ranks 2 --bind 1 \
  "${sweep[@]}" --out "$figs/all_reduce_inproc_bound.json"
if [ ${#mpirun[@]} -gt 0 ]; then
  measure all_reduce_mpi bench -- "${mpirun[@]}" 2 "$bench" collective all_reduce --backend mpi "${sweep[@]}" \
    --out "$figs/all_reduce_mpi.json"
else
  skip all_reduce_mpi "mpirun is not installed"
fi

echo "== a step under each policy, scaling"
measure step bench -- "$bench" step --ranks 1,2 "${step[@]}" --out "$figs/step.json"
measure scaling bench -- "$bench" scaling --ranks 2 "${scaling[@]}" --hooks bf16,fp16,powersgd "${data[@]}" \
  --out "$figs/scaling.json"
measure scaling_adamw bench -- "$bench" scaling --ranks 2 "${scaling[@]}" --optimizer adamw "${data[@]}" \
  --out "$figs/scaling_adamw.json"

echo "== the character-level GPT (ddp::nn::gpt): a step under each policy, scaling at two sizes"
if [ $quick = 1 ]; then
  gpt_step=(--batch 4 --steps 2 --repeats 1) gpt_scaling=(--rounds 1 --steps 2 --batch 2) gpt10m_scaling=()
else
  gpt_step=(--batch 32 --steps 3 --repeats 5) gpt_scaling=(--rounds 5 --steps 10 --batch 12)
  gpt10m_scaling=(--rounds 2 --steps 3 --batch 4)
fi
measure step_gpt bench -- "$bench" step --model gpt --ranks 1,2 "${gpt_step[@]}" --out "$figs/step_gpt.json"
measure scaling_gpt bench -- "$bench" scaling --model gpt "${gpt_scaling[@]}" --hooks bf16,fp16,powersgd \
  --out "$figs/scaling_gpt.json"
if [ $quick = 1 ]; then  # the same code as --model gpt, at 13 times the parameters
  skip scaling_gpt10m "--quick leaves it out (the same set-ups as the example's size, seconds each)"
else
  measure scaling_gpt10m bench -- "$bench" scaling --model gpt-10m "${gpt10m_scaling[@]}" --out "$figs/scaling_gpt10m.json"
fi
# reduction::invariant at that size in shards of 32 sequences (2 ranks of 32), beside the plain
# reduction over the same two micro-batches: about 7 s a step on 2 idle cores, 7 minutes in all.
if [ $quick = 1 ]; then
  skip step_gpt10m "--quick leaves it out (the same code as --model gpt, at 13 times the parameters)"
else
  measure step_gpt10m bench -- "$bench" step --model gpt-10m --ranks 2 --batch 32 --steps 1 --repeats 2 \
    --vary reduction --out "$figs/step_gpt10m.json"
fi

echo "== the same bits at any world size, losing a rank"
measure invariance bench -- "$bench" invariance "${invariance[@]}" --ranks $invariance_ranks "${data[@]}" \
  --out "$figs/invariance.json"
rm -f "$figs"/invariance_mpi_np*.json
if [ ${#mpirun[@]} -gt 0 ]; then
  for np in $mpi_worlds; do
    measure invariance_mpi_np$np bench -- "${mpirun[@]}" $np "$bench" invariance --backend mpi "${invariance[@]}" \
      --update replicated,sharded --optimizer sgd,adamw "${data[@]}" --out "$figs/invariance_mpi_np$np.json"
  done
fi
# The plain reduction dealt the same way: the hashes differ between world sizes (exit status 1).
measure invariance_plain bench --exit 1 -- "$bench" invariance "${invariance[@]}" --ranks 1,2,3 --update replicated \
  --optimizer sgd --reduction plain "${data[@]}" --out "$figs/invariance_plain.json"
measure lose bench -- "$bench" invariance "${invariance[@]}" --ranks $invariance_ranks --update replicated \
  --lose $lose_at --rejoin $rejoin_after "${data[@]}" --out "$figs/lose.json"

echo "== the Fashion-MNIST example"
measure example_1rank example -- "$example" --ranks 1 "${epochs[@]}" "${data[@]}" --no-progress
measure example_2ranks example -- "$example" --ranks 2 "${epochs[@]}" "${data[@]}" --no-progress
measure example_2ranks_sharded example -- "$example" --ranks 2 --update sharded "${epochs[@]}" "${data[@]}" --no-progress
measure example_2ranks_sharded_gradients example -- "$example" --ranks 2 --update sharded_gradients "${epochs[@]}" "${data[@]}" --no-progress
measure example_2ranks_fully_sharded example -- "$example" --ranks 2 --update fully_sharded "${epochs[@]}" "${data[@]}" --no-progress
measure example_2ranks_invariant example -- "$example" --ranks 2 --reduction invariant "${epochs[@]}" "${data[@]}" \
  --no-progress
example_mpi=$build/examples/fashion_mnist/fashion_mnist_mpi
if [ ${#mpirun[@]} -gt 0 ] && [ -x "$example_mpi" ]; then
  measure example_mpi_2ranks example -- "${mpirun[@]}" 2 "$example_mpi" "${epochs[@]}" "${data[@]}" --no-progress
else
  skip example_mpi_2ranks "fashion_mnist_mpi is not built in $build (or mpirun is missing)"
fi
# The loader: one epoch each, reading the .gz files into memory, with a prefetch thread, and
# mapping uncompressed files (peak RSS is the process's, data set included). The uncompressed
# copy stays in the build directory (55 MB), so the page's command can be run again.
idx=$build/fashion-mnist-idx
[ $quick = 1 ] && idx=$scratch/idx
mkdir -p "$idx"
for f in "${data[1]:-/usr/share/datasets/fashion-mnist}"/*.gz; do
  [ -s "$idx/$(basename "${f%.gz}")" ] || gunzip -c "$f" > "$idx/$(basename "${f%.gz}")"
done
measure example_epoch1 example -- "$example" --ranks 2 "${one_epoch[@]}" "${data[@]}" --no-progress
measure example_epoch1_prefetch example -- "$example" --ranks 2 "${one_epoch[@]}" "${data[@]}" --prefetch 2 --no-progress
measure example_epoch1_mapped example -- "$example" --ranks 2 "${one_epoch[@]}" --mapped --data-dir "$idx" \
  --no-progress
# One epoch's step timeline, for the overlap plot (0.8 MB: not kept).
"$example" "${one_epoch[@]}" "${data[@]}" --no-progress --trace "$scratch/trace.json" > /dev/null

echo "== processes under ddp-run: a rank killed, a fault-injection loop"
ddp_run=$build/src/run/ddp-run worker=$build/tests/ddp_run_worker
if [ ${#mpirun[@]} -gt 0 ] && [ -x "$ddp_run" ] && [ -x "$example_mpi" ] && [ -x "$worker" ]; then
  run=("$ddp_run" -n 3 --launcher-args "--oversubscribe --bind-to none")
  # A global batch fixed at 3 ranks' (192), so that the world of 2 after the kill trains the same steps.
  example_args=("$example_mpi" --epochs 3 --reduction invariant --global-batch 192 "${data[@]}" --no-progress)
  measure ddp_run_example ddp_run -- "${run[@]}" --report "$scratch/ddp_run_example.json" -- "${example_args[@]}"
  # Killed about 1.4 epochs after the first step: in epoch 2 of 3.
  kill_after=$("$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(round(1.4*d["epochs"][0]["seconds"],2))' \
    "$figs/ddp_run_example.json")
  measure ddp_run_example_kill ddp_run -- "${run[@]}" --kill-every "$kill_after" --kill-count 1 \
    --report "$scratch/ddp_run_example_kill.json" -- "${example_args[@]}"
  if [ $quick = 1 ]; then loop=(--epochs 20 --step-ms 2) faults=1; else loop=(--epochs 1500 --step-ms 2) faults=40; fi
  measure ddp_run_loop_ref ddp_run -- "${run[@]}" --report "$scratch/ddp_run_loop_ref.json" -- \
    "$worker" "${loop[@]}" --out "$scratch/loop_ref"
  measure ddp_run_loop ddp_run -- "${run[@]}" --spares 100000 --max-restarts 100000 --kill-every 0.5 \
    --kill-count $faults --kill-seed 7 --report "$scratch/ddp_run_loop.json" -- "$worker" "${loop[@]}" --out "$scratch/loop"
  results annotate "$figs" ddp_run_loop same_params \
    "$(cmp -s "$scratch/loop_ref/params" "$scratch/loop/params" && echo true || echo false)"
else
  for name in ddp_run_example ddp_run_example_kill ddp_run_loop_ref ddp_run_loop; do
    skip $name "ddp-run, fashion_mnist_mpi or ddp_run_worker is not built in $build (or mpirun is missing)"
  done
fi

echo "== host kernels"
if [ -x "$build/bench/host_kernels" ]; then
  measure host_kernels kernels -- "$build/bench/host_kernels" "${kernels[@]}" \
    --benchmark_out="$figs/host_kernels.json" --benchmark_out_format=json
else
  skip host_kernels "host_kernels is not built in $build (cmake --build $build --target host_kernels)"
fi

echo "== libtorch against PyTorch's DDP"
if [ $quick = 1 ]; then
  skip torch_vs_pytorch "--quick leaves it out (several minutes per epoch on 2 cores)"
elif [ ! -x "$build/examples/torch_fashion_mnist/torch_fashion_mnist" ]; then
  skip torch_vs_pytorch "torch_fashion_mnist is not built in $build (needs libtorch-dev)"
elif ! "$py" -c 'import torch' 2> /dev/null; then
  skip torch_vs_pytorch "PyTorch for Python is not installed (apt-get install python3-torch)"
else
  measure torch_vs_pytorch torch -- bench/torch_vs_pytorch.sh "$build" 1 2
fi

echo "== the GPT against PyTorch's DDP"
if [ $quick = 1 ]; then
  skip gpt_vs_pytorch "--quick leaves it out (minutes on 2 cores)"
elif [ ! -x "$build/examples/char_gpt/char_gpt" ] || [ ! -x "$build/examples/char_gpt_torch/char_gpt_torch" ]; then
  skip gpt_vs_pytorch "char_gpt or char_gpt_torch is not built in $build (cmake --build $build --target char_gpt char_gpt_torch)"
elif ! "$py" -c 'import torch' 2> /dev/null; then
  skip gpt_vs_pytorch "PyTorch for Python is not installed (apt-get install python3-torch)"
else
  measure gpt_vs_pytorch gpt -- bench/gpt_vs_pytorch.sh "$build" 80 3 200 "1 2 3"
fi

echo "== sync schedules on the GPT: bytes and validation loss at equal steps, time to a loss over a slow link"
if [ $quick = 1 ]; then
  skip sync_schedules "--quick leaves it out (minutes on 2 cores)"
  skip sync_schedules_link "--quick leaves it out (minutes on 2 cores)"
elif [ ! -x "$build/examples/char_gpt/char_gpt" ]; then
  skip sync_schedules "char_gpt is not built in $build"
  skip sync_schedules_link "char_gpt is not built in $build"
else
  measure sync_schedules bench -- bench/sync_schedules.py compare "$build" --steps 1000 --out "$figs/sync_schedules.json"
  if [ ! -x "$build/examples/char_gpt/char_gpt_mpi" ] || [ "$(id -u)" != 0 ]; then
    skip sync_schedules_link "two network-namespace hosts need root and char_gpt_mpi (OpenMPI)"
  else
    measure sync_schedules_link bench -- bench/sync_schedules.py link "$build" --steps 600 --target 2.4 \
      --eval-every 50 --eval-sequences 256 --out "$figs/sync_schedules_link.json"
  fi
fi

echo "== build and test times"
if [ $with_build = 1 ]; then
  touch examples/fashion_mnist/main.cpp examples/fashion_mnist/train.cpp
  measure build_example timed -- cmake --build "$build" --target fashion_mnist -j"${DDP_JOBS:-2}"
elif [ $quick = 1 ] || [ ! -f "$figs/build_example.json" ]; then
  skip build_example "run with --with-build to time the example's build"
fi
if [ -f "$build/test-times.txt" ]; then
  results test-times "$figs" "$build/test-times.txt"
elif [ $quick = 1 ] || [ ! -f "$figs/test_command.json" ]; then
  skip test_command "$build/test-times.txt does not exist: ./scripts/test.sh writes it"
fi

echo "== plots"
if "$py" -c 'import matplotlib' 2> /dev/null; then
  inputs=("$figs/all_reduce_inproc.json" "$figs/all_reduce_inproc_bound.json")
  [ ${#mpirun[@]} -gt 0 ] && inputs+=("$figs/all_reduce_mpi.json")
  "$py" bench/plot.py collective "$figs/all_reduce.png" "${inputs[@]}"
  "$py" bench/plot.py step "$figs/step.png" "$figs/step.json"
  "$py" bench/plot.py trace "$figs/trace_overlap.png" "$scratch/trace.json"
else
  echo "results.sh: no plots: matplotlib is not installed (apt-get install python3-matplotlib)"
fi

results render scripts/results.md.in "$figs" "$out/results.md"
results check "$out/results.md" .
echo "results.sh: wrote $out/results.md and $figs/"
