#!/usr/bin/env bash
# A rank that never joins a collective (rank_faults.cpp missing) on MPI processes: the watchdog ends the
# job, and every rank's flight recorder has dumped first (the asleep rank when the others' roll
# call reached it); ddp-why names rank 1 as the rank that never issued collective #1.
#   tests/mpi/rank_missing_why.sh <ddp-why> <mpirun and its arguments...> <ddp_mpi_rank_faults> missing
set -uo pipefail
why=$1
shift
dumps=$(mktemp -d)
trap 'rm -rf "$dumps"' EXIT
DDP_FLIGHT_RECORDER_DIR="$dumps" "$@" > "$dumps/job.log" 2>&1 && { echo "FAIL: the job did not end in the watchdog's abort"; exit 1; }
"$why" "$dumps" > "$dumps/verdict.txt"
status=$?
cat "$dumps/verdict.txt"
[ $status = 2 ] || { echo "FAIL: ddp-why exited $status, not 2 (the ranks differ)"; cat "$dumps/job.log"; exit 1; }
grep -q "^first difference: collective #1, kind: not_issued" "$dumps/verdict.txt" \
  && grep -q "^  ranks 0, 2: all_reduce #1 (count 16, f32, sum; outside a step, unspecified; started)" "$dumps/verdict.txt" \
  && grep -q "^  rank 1: never issued it" "$dumps/verdict.txt" \
  && grep -q "^  rank 1: all_reduce #0 " "$dumps/verdict.txt" \
  || { echo "FAIL: the verdict does not name rank 1 and collective #1"; exit 1; }
echo "ok: ddp-why names rank 1, which never issued all_reduce #1"
