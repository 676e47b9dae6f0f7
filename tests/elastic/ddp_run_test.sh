#!/usr/bin/env bash
# ddp-run kills and restarts: for SGD-momentum and AdamW with a replicated update, and AdamW with a
# sharded one, 3 processes train 2 epochs under reduction::invariant<8> once without a fault and
# once with rank 1 killed (SIGKILL) in its second micro-batch of step 5. The killed run must
# finish on 2 ranks after one restart, take every sample of each epoch exactly once across the
# memberships (a sharded update goes back to its last checkpoint and takes the steps since
# again), and end with the same
# parameters and buffers, bit for bit, as the run without a fault. Then a fault-injection loop:
# ddp-run kills a random rank half a second into each membership's training, 4 times (spare slots
# keep the world at 3) while the run
# trains 100 epochs of 4 steps (each micro-batch lasting 2 ms at least); it must end with the bits of the run without faults, every sample once.
# Between the two: every rank raises the same error a moment apart, and the run ends at once; and
# rank 1 hangs (sleeps for good) in a step, and it is the rank removed, not one that waited for it.
#   tests/elastic/ddp_run_test.sh <ddp-run> <ddp_run_worker> [launcher arguments]
set -euo pipefail
ddp_run=$1 worker=$2
shift 2
launcher_args="$*"
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp_run_test.XXXXXX")
# On failure the logs, reports and states stay (a run that fails once in many must be readable).
trap 'status=$?; if [ $status -eq 0 ]; then rm -rf "$work"; else echo "ddp_run_test: logs kept in $work"; fi' EXIT
rows=96

# Every sample once per epoch. Each rank logs a step's samples as it begins it; the attempt at
# step S that counted is that of the last membership that started before S (ddp-run's report
# gives where each went on from: a later one started from a state that held S, or went back
# before it).
each_sample_once() {
  local dir=$1 epochs=$2 report=$3
  local resumed
  resumed="0 $(grep -o '"resumed_at": [0-9]*' "$report" | awk '{printf "%s ", $2}')"
  awk -v rows=$rows -v epochs=$epochs -v resumed="$resumed" '
    BEGIN { nm = split(resumed, start, " ") }
    { m = FILENAME; sub(/.*samples-/, "", m); sub(/-.*/, "", m); m += 1
      line[m, $1, ++n[m, $1]] = $2 " " $3; steps[$1] = 1 }
    END {
      for (s in steps) {
        mm = 0
        for (k = 1; k <= nm; ++k) if (start[k] + 0 < s + 0) mm = k
        for (i = 1; i <= n[mm, s]; ++i) taken[line[mm, s, i]]++
      }
      bad = 0
      for (e = 0; e < epochs; ++e) for (r = 0; r < rows; ++r)
        if (taken[e " " r] != 1) { printf "epoch %d sample %d taken %d times\n", e, r, taken[e " " r]; if (++bad > 5) exit 1 }
      exit bad > 0
    }' "$dir"/samples-*
}

for combo in "sgd replicated" "adamw replicated" "adamw sharded"; do
  set -- $combo
  name="$1-$2"
  args=(--optimizer "$1" --update "$2")
  [ "$2" = sharded ] && extra=(--checkpoint "$work/$name-ckpt") || extra=()
  "$ddp_run" -n 3 --launcher-args "$launcher_args" --report "$work/$name-ref.json" -- \
    "$worker" "${args[@]}" --out "$work/$name-ref" > "$work/$name-ref.log" 2>&1 \
    || { cat "$work/$name-ref.log"; echo "FAIL $name: the run without a fault failed"; exit 1; }
  start=$(date +%s.%N)
  DDP_FLIGHT_RECORDER_DIR="$work/$name-dumps" "$ddp_run" -n 3 --max-restarts 1 --launcher-args "$launcher_args" --report "$work/$name-kill.json" -- \
    "$worker" "${args[@]}" "${extra[@]}" --kill 1@5.1 --out "$work/$name-kill" > "$work/$name-kill.log" 2>&1 \
    || { cat "$work/$name-kill.log"; echo "FAIL $name: the run with rank 1 killed did not finish"; exit 1; }
  grep -q '"old_world": 3, "new_world": 2' "$work/$name-kill.json" \
    || { cat "$work/$name-kill.log" "$work/$name-kill.json"; echo "FAIL $name: no 3 -> 2 restart reported"; exit 1; }
  grep -q 'ended without a word' "$work/$name-kill.json" \
    || { cat "$work/$name-kill.json"; echo "FAIL $name: the cause is not the killed process"; exit 1; }
  each_sample_once "$work/$name-kill" 2 "$work/$name-kill.json" || { echo "FAIL $name: a sample was lost or taken twice"; exit 1; }
  # The new membership went on from the survivors' step (a sharded update: its last checkpoint,
  # step 4), not from the beginning.
  [ "$2" = sharded ] && resumed=4 || resumed=5
  first=$(cat "$work/$name-kill"/samples-1-* | sort -n | head -1 | cut -d' ' -f1)
  [ "$first" = $((resumed + 1)) ] \
    || { echo "FAIL $name: the restarted ranks' first step was $first, not $((resumed + 1))"; exit 1; }
  cmp "$work/$name-ref/params" "$work/$name-kill/params" \
    || { cat "$work/$name-kill.log"; echo "FAIL $name: the parameters differ from the run without a fault"; exit 1; }
  # The survivors' flight recorders dumped when ddp-run told them of the death: ddp-why (DDP_WHY)
  # says rank 1's dump is missing (exit 3) and gives its last collective as they saw it.
  if [ -n "${DDP_WHY:-}" ]; then
    why=0
    "$DDP_WHY" --backend mpi "$work/$name-dumps" > "$work/$name-why.txt" 2>&1 || why=$?
    { [ $why = 3 ] && grep -q "^missing dump: rank 1 " "$work/$name-why.txt" \
        && grep -q "its last collective as the others saw it: .*, completed by every other rank" "$work/$name-why.txt"; } \
      || { cat "$work/$name-why.txt"; echo "FAIL $name: ddp-why exited $why without naming rank 1's dump as missing"; exit 1; }
  fi
  grep -h "ddp-run:" "$work/$name-kill.log" | sed "s/^/$name: /"
  echo "ok $name: killed at step 5, restarted on 2 ranks, every sample once, the same bits"
done

# Every rank raises the same error in step 3, rank r 150 x r ms after rank 0: the run ends at once
# with that error, as one error of every rank, without a restart (not after --max-restarts).
if "$ddp_run" -n 3 --max-restarts 3 --launcher-args "$launcher_args" --report "$work/same-error.json" -- \
  "$worker" --throw-at 3:150 --out "$work/same-error" > "$work/same-error.log" 2>&1; then
  cat "$work/same-error.log"; echo "FAIL same error: ddp-run finished"; exit 1
fi
grep -q 'ddp-run: cannot go on: every rank failed (.*injected error in step 3' "$work/same-error.log" \
  || { cat "$work/same-error.log"; echo "FAIL same error: the run did not end as every rank's error"; exit 1; }
grep -q '"restarts": \[\]' "$work/same-error.json" \
  || { cat "$work/same-error.log" "$work/same-error.json"; echo "FAIL same error: the run restarted"; exit 1; }
echo "ok same error: every rank raised it a moment apart, the run ended at once without a restart"

# Rank 1 stops making progress (it sleeps for good in step 3) without dying: ranks 0 and 2 wait for
# it past their 2 s timeout, and ddp-run removes rank 1, not a rank that waited; the run goes on
# on 2 ranks with the bits of the run without a fault.
"$ddp_run" -n 3 --max-restarts 1 --launcher-args "$launcher_args" --report "$work/hang.json" -- \
  "$worker" --hang 1@3 --timeout-ms 2000 --out "$work/hang" > "$work/hang.log" 2>&1 \
  || { cat "$work/hang.log"; echo "FAIL hang: the run with a hung rank did not finish"; exit 1; }
grep -q '"failed_rank": 1, "cause": "it stopped making progress: rank(s) 0, 2 waited for it' "$work/hang.json" \
  || { cat "$work/hang.log" "$work/hang.json"; echo "FAIL hang: rank 1, which hung, was not the one removed"; exit 1; }
grep -q '"old_world": 3, "new_world": 2' "$work/hang.json" \
  || { cat "$work/hang.json"; echo "FAIL hang: no 3 -> 2 restart reported"; exit 1; }
cmp "$work/sgd-replicated-ref/params" "$work/hang/params" \
  || { cat "$work/hang.log"; echo "FAIL hang: the parameters differ from the run without a fault"; exit 1; }
echo "ok hang: rank 1 hung in step 3, it was removed (not a rank that waited for it), the same bits"

epochs=100
"$ddp_run" -n 3 --launcher-args "$launcher_args" -- "$worker" --epochs $epochs --out "$work/loop-ref" > "$work/loop-ref.log" 2>&1 \
  || { cat "$work/loop-ref.log"; echo "FAIL loop: the run without a fault failed"; exit 1; }
"$ddp_run" -n 3 --spares 1000 --max-restarts 1000 --kill-every 0.5 --kill-count 4 --kill-seed 7 --launcher-args "$launcher_args" \
  --report "$work/loop.json" -- "$worker" --epochs $epochs --step-ms 2 --out "$work/loop" > "$work/loop.log" 2>&1 \
  || { cat "$work/loop.log"; echo "FAIL loop: the run with injected faults did not finish"; exit 1; }
faults=$(sed -n 's/.*"faults_injected": \([0-9]*\).*/\1/p' "$work/loop.json")
[ "${faults:-0}" -eq 4 ] || { cat "$work/loop.log"; echo "FAIL loop: only ${faults:-0} faults injected"; exit 1; }
each_sample_once "$work/loop" $epochs "$work/loop.json" || { echo "FAIL loop: a sample was lost or taken twice"; exit 1; }
cmp "$work/loop-ref/params" "$work/loop/params" \
  || { cat "$work/loop.log"; echo "FAIL loop: the parameters differ from the run without faults"; exit 1; }
grep -h "recovery_s" "$work/loop.json" | grep -o '"recovery_s": [0-9.a-z]*' | tr '\n' ' '; echo
echo "ok loop: $faults faults injected and survived, the same bits as the run without faults"
