#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cpp: the IDX reader, the checkpoint reader) with
# clang, ASan and UBSan, and runs each for SECONDS from its checked-in seed corpus
# (tests/fuzz/corpus/<target>/; new inputs go to a scratch copy, not into the tree). A crash, a
# sanitizer report or a leak fails the run; the input that did it is kept in build-fuzz/.
#   scripts/fuzz.sh [seconds per target, default 30]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
out=build-fuzz
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude)
for src in tests/fuzz/*_fuzz.cpp; do
  name=$(basename "$src" .cpp)
  clang++ "${flags[@]}" "$src" -o "$out/$name" -lz &
done
wait
# The fuzzers run side by side (one core each), then each reports.
declare -A pid
for src in tests/fuzz/*_fuzz.cpp; do
  name=$(basename "$src" .cpp)
  corpus="$out/corpus-$name"
  rm -rf "$corpus" && mkdir -p "$corpus"
  cp tests/fuzz/corpus/"${name%_fuzz}"/* "$corpus"/
  (cd "$out" && "./$name" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$name-" \
     "corpus-$name" > "$name.log" 2>&1) &
  pid[$name]=$!
done
status=0
for src in tests/fuzz/*_fuzz.cpp; do
  name=$(basename "$src" .cpp)
  corpus="$out/corpus-$name"
  echo "== $name: ${seconds} s from $(ls tests/fuzz/corpus/"${name%_fuzz}" | wc -l) seed(s)"
  if ! wait "${pid[$name]}"; then
    echo "FAILED: $name found an input that breaks it (build-fuzz/$name-*; log build-fuzz/$name.log):"
    tail -40 "$out/$name.log"
    status=1
  else
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$out/$name.log" | sed 's/^/   /'
    echo "   corpus: $(ls "$corpus" | wc -l) inputs"
  fi
done
exit $status
