#!/usr/bin/env bash
# A 4 KiB in-process all_reduce (2 ranks) with busy neighbours: one `yes > /dev/null` per core
# beside it, then without them. Pass several ddp-bench binaries (builds of two versions) and they
# run alternated, so that each sees the same machine; each line is one run's medians and tails.
#   bench/busy_neighbour.sh [--runs N] [--bind] build/bench/ddp-bench [other/ddp-bench ...]
set -euo pipefail
runs=4 bind=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --bind) bind=(--bind 1); shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "usage: $0 [--runs N] [--bind] DDP_BENCH [DDP_BENCH ...]" >&2; exit 2; }
one() {  # binary, label
  "$1" collective all_reduce --ranks 2 -b 4K -e 4K -n 100 "${bind[@]}" 2>&1 |
    awk -v w="$1" -v n="$2" '$1 == 4096 { printf "%-6s %-40s oop(us) %9s  p50 %9s  p90 %9s  p99 %9s  max %9s\n", n, w, $6, $19, $20, $21, $22 }'
}
neighbours=()
for _ in $(seq "$(nproc)"); do yes > /dev/null & neighbours+=($!); done
trap 'kill "${neighbours[@]}" 2> /dev/null || true' EXIT
sleep 1
for _ in $(seq "$runs"); do for b in "$@"; do one "$b" busy; done; done
kill "${neighbours[@]}"; neighbours=()
sleep 1
for _ in $(seq "$runs"); do for b in "$@"; do one "$b" quiet; done; done
