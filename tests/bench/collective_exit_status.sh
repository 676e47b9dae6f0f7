#!/usr/bin/env bash
# ddp-bench collective's exit status and its one-rank columns (docs/benchmarking.md):
#   - a wrong element fails the run: with --inject-wrong (one element of every checked result
#     altered on rank 0) the exit status is 1, stderr says how many were wrong, and --out's file
#     carries the failure among its notes; under mpirun too (and -T), when MPIRUN... is given;
#   - the same run without it exits 0;
#   - on one rank the in-place form moves nothing: its time and bandwidth read n/a, a note says
#     why, and its result is still checked (ip_#wrong 0);
#   - a size that runs past -T stops the sweep: exit status 1, a TIMEOUT line naming the size;
#   - --check bits under the plain reduction at 1, 2, 3 ranks finds differing bits and says that
#     the plain reduction explains it (exit status 1);
#   - -G is not a flag of the host build (only ddp-bench-gpu launches through CUDA graphs).
#   tests/bench/collective_exit_status.sh DDP_BENCH OUT_DIR [MPIRUN...]
set -uo pipefail
bench=$1 out=$2
shift 2
fail() { echo "collective_exit_status: FAILED: $*"; exit 1; }
mkdir -p "$out"
brief=(-b 64 -e 1K -f 4 -n 2 -w 1 --repeats 1)

rc=0
"$bench" collective all_reduce --ranks 2 "${brief[@]}" --inject-wrong --out "$out/wrong.json" 2> "$out/wrong.err" || rc=$?
cat "$out/wrong.err"
[ $rc = 1 ] || fail "a run with wrong elements exited $rc, not 1"
grep -q "^ddp-bench: FAILED: 6 wrong element(s) in the checked results" "$out/wrong.err" ||
  fail "a run with wrong elements did not say how many on stderr"
grep -q '"FAILED: 6 wrong element(s)' "$out/wrong.json" || fail "the file of a run with wrong elements does not say so"

"$bench" collective all_reduce --ranks 2 "${brief[@]}" > /dev/null || fail "a run without wrong elements exited $?, not 0"

rc=0
"$bench" collective all_reduce --ranks 1 "${brief[@]}" --out "$out/one_rank.json" > /dev/null || rc=$?
[ $rc = 0 ] || fail "a one-rank run exited $rc"
rows=$(grep -c '"size(B)":' "$out/one_rank.json")
[ "$rows" = 3 ] || fail "a one-rank run wrote $rows rows, not 3"
for column in 'ip_time(us)' ip_algbw ip_busbw; do
  [ "$(grep -c "\"$column\": \"n/a\"" "$out/one_rank.json")" = "$rows" ] || fail "one rank: $column is not n/a in every row"
done
[ "$(grep -c '"ip_#wrong": 0,' "$out/one_rank.json")" = "$rows" ] || fail "one rank: the in-place result was not checked"
[ "$(grep -c '"oop_time(us)": [0-9]' "$out/one_rank.json")" = "$rows" ] || fail "one rank: the out-of-place form was not timed"
grep -q '"1 rank: an in-place call moves nothing' "$out/one_rank.json" || fail "one rank: no note says why in-place reads n/a"

rc=0
"$bench" collective all_reduce --ranks 2 "${brief[@]}" -T 0.000001 > /dev/null 2> "$out/timeout.err" || rc=$?
[ $rc = 1 ] || { cat "$out/timeout.err"; fail "a size past -T exited $rc, not 1"; }
grep -q "^ddp-bench: TIMEOUT: size 64 B (f32, sum) ran past -T" "$out/timeout.err" || fail "-T: no TIMEOUT line naming the size"

rc=0
"$bench" collective all_reduce --check bits --reduction plain --ranks 1,2,3 -e 16K > "$out/plain_bits.log" 2>&1 || rc=$?
[ $rc = 1 ] || { cat "$out/plain_bits.log"; fail "--check bits --reduction plain at 1, 2, 3 ranks exited $rc, not 1"; }
grep -q "^ddp-bench: FAILED: bits: DIFFER: .*expected under --reduction plain" "$out/plain_bits.log" ||
  fail "--check bits --reduction plain did not say that the plain reduction explains the difference"

rc=0
"$bench" collective all_reduce --ranks 2 -G 1 > "$out/graph.log" 2>&1 || rc=$?
[ $rc != 0 ] && grep -q -- "-G" "$out/graph.log" || fail "-G was taken by the host build"

if [ $# -gt 0 ]; then
  rc=0
  "$@" -np 2 "$bench" collective all_reduce --backend mpi "${brief[@]}" --inject-wrong > "$out/mpi_wrong.log" 2>&1 || rc=$?
  [ $rc != 0 ] || { cat "$out/mpi_wrong.log"; fail "under mpirun a run with wrong elements exited 0"; }
  grep -q "^ddp-bench: FAILED: 6 wrong element(s)" "$out/mpi_wrong.log" || fail "under mpirun rank 0 did not say so"
  rc=0
  "$@" -np 2 "$bench" collective all_reduce --backend mpi "${brief[@]}" -T 0.000001 > "$out/mpi_timeout.log" 2>&1 || rc=$?
  [ $rc != 0 ] || { cat "$out/mpi_timeout.log"; fail "under mpirun a size past -T exited 0"; }
  grep -q "^ddp-bench: TIMEOUT: size 64 B" "$out/mpi_timeout.log" || fail "under mpirun rank 0 did not report the -T size"
fi
echo "collective_exit_status: a wrong element and a size past -T fail the run (exit 1$([ $# -gt 0 ] && echo ", under mpirun too")); plain bits differ, and say why; one rank's in-place columns read n/a"
