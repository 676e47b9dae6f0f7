#!/usr/bin/env bash
# The world-size sweep of reduction::invariant (docs/reduction.md): the example's model trained
# 25 steps on Fashion-MNIST at 1, 2, 3, 4, 6 and 8 in-process ranks, replicated and sharded, with
# SGD-momentum and AdamW, gives one hash of parameters and buffers per set-up; under mpirun
# (when MPIRUN... is given) np 1 to 4 give the in-process hashes; the plain reduction dealt the
# same way gives different hashes and exits 1 (the check can fail). With a rank lost in step 10
# (--lose 1@10: launch_elastic, the others go on) and joining again in step 18 (--rejoin 8: the
# world grows back to its size) every world size still gives the uninterrupted run's hash.
#   tests/bench/invariance_sweep.sh DDP_BENCH OUT_DIR [MPIRUN...]
set -uo pipefail
bench=$1 out=$2
shift 2
fail() { echo "invariance_sweep: FAILED: $*"; exit 1; }
mkdir -p "$out"

"$bench" invariance --steps 25 --ranks 1,2,3,4,6,8 --out "$out/invariance.json" | tee "$out/inproc.txt" ||
  fail "the in-process sweep gave more than one hash per set-up (exit $?)"
hash_of() { awk -v u="$1" -v o="$2" '$2 == "inproc" && $3 == u && $4 == o { print $5; exit }' "$out/inproc.txt"; }

if [ $# -gt 0 ]; then
  for setup in "replicated sgd" "sharded adamw"; do
    read -r update optimizer <<< "$setup"
    expected=$(hash_of "$update" "$optimizer")
    [ -n "$expected" ] || fail "no in-process hash for $update/$optimizer"
    for np in 1 2 3 4; do
      "$@" -np $np "$bench" invariance --backend mpi --steps 25 --update "$update" --optimizer "$optimizer" \
        --expect "$expected" | grep " mpi " || fail "mpirun -np $np ($update, $optimizer) did not give $expected"
    done
  done
fi

"$bench" invariance --steps 25 --ranks 1,3,8 --update replicated --lose 1@10 --rejoin 8 --out "$out/lose.json" |
  tee "$out/lose.txt" || fail "losing rank 1 in step 10 and its joining again in step 18 changed the hash (exit $?)"
lost_hash=$(awk '$2 == "inproc" && $4 == "sgd" && $5 == "1@10" && $9 == $1 { print $11; exit }' "$out/lose.txt")
[ "$lost_hash" = "$(hash_of replicated sgd)" ] ||
  fail "the run that lost a rank gave $lost_hash, the uninterrupted sweep $(hash_of replicated sgd)"

rc=0
"$bench" invariance --steps 5 --hidden 64 --ranks 1,2,3 --update replicated --optimizer sgd --reduction plain \
  > "$out/plain.txt" || rc=$?
cat "$out/plain.txt"
[ $rc = 1 ] || fail "the plain reduction's sweep exited $rc, not 1: the check cannot fail"
grep -q "the hashes differ between world sizes" "$out/plain.txt" || fail "the plain sweep does not say that it differs"
echo "invariance_sweep: one hash per set-up at every world size"
