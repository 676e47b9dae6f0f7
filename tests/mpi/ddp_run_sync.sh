#!/usr/bin/env bash
# ddp-run with a sync schedule: 3 processes train 2 epochs under sync_schedule::diloco<4>, ending 2
# steps into a period, then call trainer.sync_now(): every rank must end with the same parameters
# and buffers, bit for bit (and without sync_now they must differ, so the comparison can fail).
# Then the same run with rank 1 killed (SIGKILL) in step 6: it goes on on 2 ranks from the
# survivors' state and ends with both ranks equal.
#   tests/mpi/ddp_run_sync.sh <ddp-run> <ddp_run_worker> [launcher arguments]
set -euo pipefail
ddp_run=$1 worker=$2
shift 2
launcher_args="$*"
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp_run_sync.XXXXXX")
trap 'status=$?; if [ $status -eq 0 ]; then rm -rf "$work"; else echo "ddp_run_sync: logs kept in $work"; fi' EXIT

# Whether ranks 0 .. n-1 wrote the same bits.
ranks_equal() {
  local dir=$1 n=$2 r
  for ((r = 1; r < n; ++r)); do cmp -s "$dir/params-0" "$dir/params-$r" || return 1; done
}
run() {
  local name=$1
  shift
  "$ddp_run" -n 3 --launcher-args "$launcher_args" --report "$work/$name.json" "$@" > "$work/$name.log" 2>&1 \
    || { cat "$work/$name.log"; echo "FAIL $name: the run failed"; exit 1; }
}

run plain -- "$worker" --sync diloco --out "$work/plain"
ranks_equal "$work/plain" 3 || { echo "FAIL plain: the ranks' parameters differ after sync_now"; exit 1; }
run unsynced -- "$worker" --sync diloco --no-sync-now --out "$work/unsynced"
ranks_equal "$work/unsynced" 3 && { echo "FAIL unsynced: the ranks are equal mid-period without sync_now"; exit 1; }
echo "ok diloco: 3 ranks, ended mid-period, equal after sync_now (and apart without it)"

run kill --max-restarts 1 -- "$worker" --sync diloco --kill 1@6 --out "$work/kill"
grep -q '"old_world": 3, "new_world": 2' "$work/kill.json" \
  || { cat "$work/kill.log" "$work/kill.json"; echo "FAIL kill: no 3 -> 2 restart reported"; exit 1; }
ranks_equal "$work/kill" 2 || { echo "FAIL kill: the ranks' parameters differ after sync_now"; exit 1; }
grep -h "ddp-run:" "$work/kill.log" | sed "s/^/kill: /"
echo "ok diloco, rank 1 killed in step 6: restarted on 2 ranks, equal after sync_now"
