#!/usr/bin/env bash
# A rank asleep inside a step on MPI processes (rank_faults.cpp asleep), poked with SIGUSR1 as a user pokes
# a job that hangs (sent to mpirun, which passes it to every process of the job): every process
# dumps its flight recorder while the job goes on waiting, and
# ddp-why names rank 1 as the rank that never issued the collective the others wait in. Then rank 1
# wakes and the job ends normally.
#   tests/mpi/rank_asleep_why.sh <ddp-why> <mpirun and its arguments...> <ddp_mpi_rank_faults> asleep
set -uo pipefail
why=$1
shift
work=$(mktemp -d)
dumps="$work/dumps"
job=
finish() {
  touch "$work/wake"
  [ -n "$job" ] && wait "$job" 2>/dev/null
  rm -rf "$work"
}
trap finish EXIT
DDP_FLIGHT_RECORDER_DIR="$dumps" "$@" "$work" > "$work/job.log" 2>&1 &
job=$!
for _ in $(seq 300); do
  [ -e "$work/asleep" ] && break
  kill -0 "$job" 2>/dev/null || { echo "FAIL: the job ended before rank 1 fell asleep"; cat "$work/job.log"; exit 1; }
  sleep 0.05
done
[ -e "$work/asleep" ] || { echo "FAIL: rank 1 never fell asleep"; cat "$work/job.log"; exit 1; }
ranks=$(ls "$work"/pid.* | wc -l)
# Poke until the others wait inside step 1's collective (their record shows it started).
verdict=
for _ in $(seq 50); do
  kill -USR1 "$job"
  sleep 0.2
  [ "$(ls "$dumps"/mpi.rank*.jsonl 2>/dev/null | wc -l)" = "$ranks" ] || continue
  "$why" "$dumps" > "$work/verdict.txt"
  status=$?
  if [ $status = 2 ] && grep -q "^first difference: .*kind: not_issued" "$work/verdict.txt" \
     && grep -Eq "^  ranks 0, 2: all_reduce #[0-9]+ \(.*; step 1, bucket 0, gradients; started\)" "$work/verdict.txt"; then
    verdict=ok
    break
  fi
done
cat "$work/verdict.txt" 2>/dev/null
[ "$verdict" = ok ] || { echo "FAIL: ddp-why's verdict on the SIGUSR1 dumps does not name rank 1 (exit ${status:-none})"; exit 1; }
grep -q "^  rank 1: never issued it" "$work/verdict.txt" \
  && grep -q "^  odd one out: rank 1$" "$work/verdict.txt" \
  || { echo "FAIL: the verdict does not name rank 1 as the rank that never issued it"; exit 1; }
[ "$(grep -l '"reason":"SIGUSR1"' "$dumps"/mpi.rank*.jsonl | wc -l)" = "$ranks" ] \
  || { echo "FAIL: not every dump was written on SIGUSR1"; head -n 1 "$dumps"/mpi.rank*.jsonl; exit 1; }
touch "$work/wake"
wait "$job"
code=$?
job=
[ $code = 0 ] || { echo "FAIL: the job exited $code after rank 1 woke"; cat "$work/job.log"; exit 1; }
echo "ok: every process dumped on SIGUSR1, ddp-why names rank 1 asleep in step 1, and the job ended normally"
