#!/usr/bin/env bash
# The GPU checks on a machine without a usable GPU, as the bundle runs them: a stand-in
# nvidia-smi that lists an H200 gets every check past the bundle's own guard, so each must then
# fail by itself with ddp's "no usable GPU" message, within its bound. None may pass, hang, or
# stop without saying why. Without any nvidia-smi the bundle must stop at once, saying so.
# Packs the bundle from BUILD's ddp_gpu targets (scripts/gpu-bundle.sh --from, nothing built).
#   tests/cuda/no_gpu.sh BUILD_DIR          (CI runs it after building ddp_gpu; about 30 s)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "no_gpu: FAILED: $*"; echo "--- the bundle's output:"; cat "$work/run.log" 2>/dev/null; exit 1; }

mkdir "$work/fake" "$work/out"
cat > "$work/fake/nvidia-smi" <<'SMI'
#!/bin/sh
case "$*" in
  *-L*) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *driver_version*) echo "999.99" ;;
  *) echo "NVIDIA-SMI 999.99 (a stand-in for tests/cuda/no_gpu.sh)" ;;
esac
SMI
chmod +x "$work/fake/nvidia-smi"
"$root/scripts/gpu-bundle.sh" --from "$build" --dir "$work/bundle" > "$work/pack.log"

# 1. No nvidia-smi at all: the bundle's guard stops it at once.
if ! command -v nvidia-smi > /dev/null; then
  rc=0
  OUT="$work/out" "$work/bundle/gpu-run-bundle.sh" > "$work/run.log" 2>&1 || rc=$?
  [ $rc = 1 ] || fail "without nvidia-smi the bundle exited $rc, not 1"
  grep -q "FAILED: no usable GPU" "$work/run.log" || fail "without nvidia-smi the bundle did not say 'no usable GPU'"
fi

# 2. A GPU listed but none usable: every check fails by itself, naming the reason.
rc=0
start=$SECONDS
PATH="$work/fake:$PATH" OUT="$work/out" DDP_GPU_OUT="$work/out" "$work/bundle/gpu-run-bundle.sh" > "$work/run.log" 2>&1 || rc=$?
seconds=$((SECONDS - start))
[ $rc = 1 ] || fail "the bundle exited $rc, not 1"
first_check=$(grep -n "^== " "$work/run.log" | head -1 | cut -d: -f1)
versions=$(head -n "$first_check" "$work/run.log")
grep -q "^driver (nvidia-smi): 999.99" <<< "$versions" || fail "the driver's version was not printed first"
grep -Eq "^CUDA driver [^,]+, CUDA runtime 13\.[0-9]+, NCCL 2\.[0-9]+\.[0-9]+" <<< "$versions" ||
  fail "the CUDA runtime's and NCCL's versions were not printed first"
! grep -q "timed out" "$work/run.log" || fail "a check hung until its timeout"
checks=0
while IFS= read -r name; do
  checks=$((checks + 1))
  section=$(awk -v n="== $name" '$0 == n { on = 1; next } /^== / { on = 0 } on' "$work/run.log")
  grep -q "no usable GPU" <<< "$section" || fail "'$name' did not fail with 'no usable GPU'"
  grep -q -- "-- $name: exit [1-9]" <<< "$section" || fail "'$name' did not fail"
done < <(sed -n 's/^== //p' "$work/run.log")
[ $checks -ge 4 ] || fail "only $checks checks ran"
[ -n "${NO_GPU_SHOW:-}" ] && cat "$work/run.log"
echo "no_gpu: $checks checks failed as they must, each with 'no usable GPU', in $seconds s; versions printed first"
