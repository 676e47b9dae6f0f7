#!/usr/bin/env bash
# Installs the dependencies, builds everything (the GPU targets only compile: no GPU here)
# and runs the whole test suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DDP_BUILD_DIR:-build}
# Each stage's wall time, printed as it ends (the CI log says where the minutes go) and recorded in
# $build/test-times.txt with the date, machine and load average, for docs/results.md
# (scripts/results.sh reads it; .ci/run appends its own stages).
mkdir -p "$build"
times=$build/test-times.txt
{ echo "command ./scripts/test.sh $*"; echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)"; echo "threads $(nproc)"
  echo "cpu $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "load_start $(cut -d' ' -f1 /proc/loadavg)"; } > "$times"
stage_start=$SECONDS
stage() {
  echo "-- stage: $1 took $((SECONDS - stage_start)) s"
  { echo "stage $1 $((SECONDS - stage_start))"; echo "load_end $(cut -d' ' -f1 /proc/loadavg)"; } >> "$times"
  stage_start=$SECONDS
}
scripts/install-deps.sh --fuzz
stage install-deps
# DDP_REQUIRE_MPI: the MPI tests fail (at configure) rather than vanish when MPI is missing.
# The GPU targets (ddp_gpu: GPU tests, GPU benchmarks, the example's GPU build) are not part of
# this run: they need no GPU to compile, and CI compiles them after it (.ci/run builds ddp_gpu);
# scripts/gpu-check.sh runs them on a machine with a GPU.
# DDP_REQUIRE_TORCH: likewise for libtorch and the ddp::torch tests.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_REQUIRE_MPI=ON -DDDP_REQUIRE_TORCH=ON -DDDP_GPU_IN_ALL=OFF
cmake --build "$build" -j"${DDP_JOBS:-2}"
stage build
source scripts/openblas-env.sh
ctest --test-dir "$build" -j"${DDP_JOBS:-2}" --output-on-failure "$@"
stage ctest
echo "ctest_entries $(ctest --test-dir "$build" -N | sed -n 's/^Total Tests: //p')" >> "$times"

# The concurrent code under the sanitizers (docs/testing.md): the in-process, trainer, data and
# communication-hook suites under AddressSanitizer + UndefinedBehaviorSanitizer, the in-process
# and trainer suites under ThreadSanitizer. Built at -O0 and without debug information (instrumented template-heavy
# units compile 3 times faster so; the reports still name the functions). Any report fails the
# run. DDP_SANITIZERS=0 skips them; DDP_SANITIZER_CXX picks their compiler.
if [ "${DDP_SANITIZERS:-1}" != 0 ]; then
  # Clang (installed with the fuzzing tools): at -O0 with the sanitizers it compiles these units in
  # half GCC's time (a trainer test: 16 s against 34 s), and it checks the code a second compiler's way.
  sanitizer_cxx=${DDP_SANITIZER_CXX:-clang++}
  for preset in asan tsan; do
    flags=$([ $preset = asan ] && echo "-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
                                || echo "-fsanitize=thread")
    cmake --preset $preset -DCMAKE_CXX_COMPILER="$sanitizer_cxx" -DCMAKE_BUILD_TYPE= \
          -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" \
          -DDDP_TEST_OPTIMIZATION=-O0 -DDDP_WITH_TORCH=OFF -DDDP_WITH_CUDA=OFF -DDDP_BUILD_EXAMPLES=OFF > /dev/null
    suites=(ddp_inproc_test ddp_trainer_test)
    [ $preset = asan ] && suites+=(ddp_data_test ddp_hook_test)
    cmake --build --preset $preset -j"${DDP_JOBS:-2}" --target "${suites[@]}"
    stage "$preset build"
    for suite in "${suites[@]}"; do
      echo "== $suite under $preset"
      # Left out: the two GPT cases whose size is their point (the 10.8M model's peak memory at
      # world 4, 200 steps of learning): 50 s under ThreadSanitizer. Their in-process ranks run
      # the code that the smaller GPT, fully_sharded and equivalence cases run here.
      ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "build-$preset/tests/$suite" --minimal \
        --test-case-exclude="ddp::nn::gpt at nanoGPT*,ddp::nn::gpt learns*"
    done
    stage "$preset run"
  done
fi

# The readers of untrusted files under libFuzzer, from their seed corpora (DDP_FUZZ_SECONDS each).
scripts/fuzz.sh "${DDP_FUZZ_SECONDS:-10}"
stage fuzz
