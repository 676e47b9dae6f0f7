#!/usr/bin/env bash
# The GPU checks on a machine without a usable GPU, as the bundle runs them. Each case must end
# with exit status 1, within its bound, saying why; none may pass, hang, or stop silently:
#   1. no nvidia-smi at all (where this machine has none): the bundle stops at once, "no usable GPU";
#   2. an nvidia-smi that fails (a driver that cannot see a GPU): the same, at once;
#   3. an nvidia-smi that never answers: the same, after its 10 s bound;
#   4. a stand-in nvidia-smi that lists an H200, and a libnccl.so.2 older than the build needs
#      found first: the versions and the libraries loaded are printed before any check, the old
#      NCCL is refused by name and the right one taken, then every check fails by itself with
#      ddp's "no usable GPU" message, within its bound, and the log lands in $OUT.
# Packs the bundle from BUILD's ddp_gpu targets (scripts/gpu-bundle.sh --from, nothing built).
#   tests/cuda/no_gpu.sh BUILD_DIR          (CI runs it after building ddp_gpu; about 15 s)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "no_gpu: FAILED: $*"; echo "--- the bundle's output:"; cat "$work/run.log" 2>/dev/null; exit 1; }

mkdir "$work/fake" "$work/broken" "$work/hangs" "$work/old-nccl" "$work/out"
cat > "$work/fake/nvidia-smi" <<'SMI'
#!/bin/sh
case "$*" in
  *-L*) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *driver_version*) echo "999.99" ;;
  *) echo "NVIDIA-SMI 999.99 (a stand-in for tests/cuda/no_gpu.sh)" ;;
esac
SMI
cat > "$work/broken/nvidia-smi" <<'SMI'
#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver (a stand-in)"
exit 9
SMI
cat > "$work/hangs/nvidia-smi" <<'SMI'
#!/bin/sh
exec sleep 600
SMI
chmod +x "$work"/*/nvidia-smi
# A libnccl.so.2 that says it is 2.27.3: ddp-bench-gpu versions must refuse it.
echo 'int ncclGetVersion(int* version) { *version = 22703; return 0; }' > "$work/old-nccl/nccl.c"
"${CC:-cc}" -shared -fPIC -o "$work/old-nccl/libnccl.so.2" "$work/old-nccl/nccl.c"
"$root/scripts/gpu-bundle.sh" --from "$build" --dir "$work/bundle" > "$work/pack.log"

# run_bundle NAME MAX_SECONDS [VAR=VALUE...]: the bundle under env, which must exit 1 within MAX_SECONDS.
run_bundle() {
  local name=$1 max=$2 rc=0 t0=$SECONDS
  shift 2
  env "$@" OUT="$work/out" "$work/bundle/gpu-run-bundle.sh" > "$work/run.log" 2>&1 || rc=$?
  seconds=$((SECONDS - t0))
  [ $rc = 1 ] || fail "$name: the bundle exited $rc, not 1"
  ((seconds <= max)) || fail "$name: the bundle took $seconds s, over $max s"
}

# 1-3. The bundle's own guard stops it, saying why.
if ! command -v nvidia-smi > /dev/null; then
  run_bundle "without nvidia-smi" 5
  grep -q "FAILED: no usable GPU (no nvidia-smi on this machine)" "$work/run.log" ||
    fail "without nvidia-smi the bundle did not say 'no usable GPU'"
fi
run_bundle "a failing nvidia-smi" 5 PATH="$work/broken:$PATH"
grep -q "FAILED: no usable GPU (nvidia-smi -L failed)" "$work/run.log" || fail "a failing nvidia-smi: no 'no usable GPU'"
run_bundle "an nvidia-smi that hangs" 25 PATH="$work/hangs:$PATH"
grep -q "FAILED: no usable GPU (nvidia-smi -L did not answer within 10 s)" "$work/run.log" ||
  fail "an nvidia-smi that hangs: no 'no usable GPU' after its bound"

# 4. A GPU listed but none usable: every check fails by itself, naming the reason.
rm -rf "$work/out"/*
run_bundle "a GPU listed, none usable" 120 PATH="$work/fake:$PATH" DDP_GPU_LIB_PATH="$work/old-nccl"
first_check=$(grep -n "^== " "$work/run.log" | head -1 | cut -d: -f1)
[ -n "$first_check" ] || fail "no check ran"
versions=$(head -n "$first_check" "$work/run.log")
grep -q "^driver (nvidia-smi): 999.99" <<< "$versions" || fail "the driver's version was not printed first"
grep -Eq "^CUDA driver [^,]+, CUDA runtime 13\.[0-9]+, NCCL 2\.[0-9]+\.[0-9]+" <<< "$versions" ||
  fail "the CUDA runtime's and NCCL's versions were not printed first"
grep -q "FAILED: the NCCL library loaded ($work/old-nccl/libnccl.so.2) is 2.27.3, older than" <<< "$versions" ||
  fail "the old libnccl.so.2 found first was not refused by name"
grep -Eq "^NCCL loaded: /.*/libnccl\.so\.2(\.[0-9.]+)? \(NCCL 2\.[0-9]+\.[0-9]+, found as /" <<< "$versions" ||
  fail "the NCCL taken was not printed"
! grep -q "^NCCL loaded: $work/old-nccl" <<< "$versions" || fail "the old NCCL was taken"
grep -Eq "^## nvidia-smi -L: ok in [0-9.]+ s \(bound [0-9]+ s\)" <<< "$versions" || fail "a step did not print its bound"
! grep -q "timed out" "$work/run.log" || fail "a check hung until its timeout"
checks=0
while IFS= read -r header; do
  name=${header% (bound * s)}
  checks=$((checks + 1))
  section=$(awk -v h="== $header" '$0 == h { on = 1; next } /^== / { on = 0 } on' "$work/run.log")
  grep -q "no usable GPU" <<< "$section" || fail "'$name' did not fail with 'no usable GPU'"
  result=$(grep -F -- "-- $name: FAILED, exit " <<< "$section") || fail "'$name' did not fail"
  [[ $result =~ exit\ [1-9][0-9]*\ after\ [0-9.]+\ s\ \(bound\ [0-9]+\ s\) ]] ||
    fail "'$name' did not print its exit status, time and bound: $result"
done < <(sed -n 's/^== //p' "$work/run.log")
[ $checks -ge 4 ] || fail "only $checks checks ran"
grep -q "^gpu-run-bundle: bounds: preflight [0-9]* s + checks [0-9]* s = [0-9]* s (at most 300 s)" "$work/run.log" ||
  fail "the bundle did not print its bounds"
[ -s "$work/out/gpu-check.log" ] || fail "the log is not in \$OUT"
[ -n "${NO_GPU_SHOW:-}" ] && cat "$work/run.log"
echo "no_gpu: without nvidia-smi, with a failing one and a hanging one the bundle stopped saying 'no usable GPU';" \
  "with a GPU listed, an old NCCL was refused and $checks checks failed as they must, each with 'no usable GPU'," \
  "in $seconds s; versions printed first"
