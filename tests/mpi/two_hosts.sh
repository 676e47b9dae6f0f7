#!/usr/bin/env bash
# Runs an MPI program on two "hosts" on this machine: two network namespaces joined by a veth
# pair, each with its own address (10.77.0.1, 10.77.0.2), its own loopback and its own host
# name, so Open MPI sees two nodes, launches the second one's daemon through a remote-shell agent
# (as it would through ssh) and moves every byte between them over TCP.
#
#   tests/mpi/two_hosts.sh MPIRUN SLOTS_A SLOTS_B PROGRAM [ARGS...]
#
# Ranks fill host A's slots first, then host B's. DDP_TWO_HOSTS_LINK, when set, is a tc queueing
# discipline that shapes the link each way (e.g. "tbf rate 100mbit burst 64kb latency 50ms" for
# 100 Mbit/s, or "netem rate 100mbit delay 10ms" where the kernel has netem). Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN)
# and iproute2; where namespaces cannot be made it says why and exits 77 (ctest's skip code).
# Called with --agent it is that remote-shell agent: "--agent HOST COMMAND..." runs COMMAND in
# HOST's namespace under HOST's name.
set -euo pipefail

if [ "${1:-}" = --agent ]; then
  host=$2
  shift 2
  ns="${DDP_TWO_HOSTS_PREFIX:?the agent runs under two_hosts.sh}-${host##*-}"
  # mpirun hands the command as words for a remote shell to join and run, as ssh would.
  exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
fi

if [ $# -lt 4 ]; then
  echo "usage: $0 MPIRUN SLOTS_A SLOTS_B PROGRAM [ARGS...]" >&2
  exit 2
fi
mpirun=$1 slots_a=$2 slots_b=$3
shift 3

prefix="ddp$$"
export DDP_TWO_HOSTS_PREFIX=$prefix
cleanup() {
  for side in a b; do
    ip netns pids "$prefix-$side" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$prefix-$side" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 143' TERM INT

if ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  echo "two_hosts: skipped: needs ip (iproute2) and unshare (util-linux)" >&2
  exit 77
fi
if ! err=$(ip netns add "$prefix-a" 2>&1); then
  echo "two_hosts: skipped: this machine does not let us make a network namespace ($err); run as root" >&2
  exit 77
fi
ip netns add "$prefix-b"
ip link add "$prefix-va" netns "$prefix-a" type veth peer name "$prefix-vb" netns "$prefix-b"
ip -n "$prefix-a" addr add 10.77.0.1/24 dev "$prefix-va"
ip -n "$prefix-b" addr add 10.77.0.2/24 dev "$prefix-vb"
for side in a b; do
  ip -n "$prefix-$side" link set lo up
  ip -n "$prefix-$side" link set "$prefix-v$side" up
  if [ -n "${DDP_TWO_HOSTS_LINK:-}" ]; then
    # shellcheck disable=SC2086  # the netem parameters are words
    ip netns exec "$prefix-$side" tc qdisc add dev "$prefix-v$side" root $DDP_TWO_HOSTS_LINK
  fi
done

# Every Open MPI channel (the daemons' out-of-band wire-up and the ranks' byte transport) is held
# to the hosts' network: nothing goes through a loopback or shared memory between the hosts.
net=10.77.0.0/24
echo "two_hosts: ddp-host-a (10.77.0.1, $slots_a slots) and ddp-host-b (10.77.0.2, $slots_b slots)" \
  "${DDP_TWO_HOSTS_LINK:+, link: $DDP_TWO_HOSTS_LINK each way}"
ip netns exec "$prefix-a" unshare --uts sh -c 'hostname ddp-host-a && exec "$@"' sh \
  "$mpirun" --allow-run-as-root --oversubscribe --bind-to none \
  --host "ddp-host-a:$slots_a,ddp-host-b:$slots_b" -np $((slots_a + slots_b)) \
  --mca plm_rsh_agent "$(readlink -f "$0") --agent" \
  --mca oob_tcp_if_include "$net" --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include "$net" \
  -x DDP_TEST_HOSTS=2 "$@"
