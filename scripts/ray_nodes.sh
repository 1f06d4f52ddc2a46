#!/usr/bin/env bash
# Real Ray nodes on one machine, for the scale-out benchmark (docs/cluster.md "Two real nodes"):
# node N runs in a network namespace of its own (its own address 10.77.0.1N, ports and
# loopback), joined to the others by a bridge, and every process it starts is pinned to core
# N-1 (taskset; Ray's workers and Serve's replicas inherit it). The gateway's node joins from
# the host's namespace (10.77.0.1) with no CPUs for replicas, as docs/cluster.md says a gateway
# host should. Needs root (ip netns) and the project's .venv (`bash scripts/test.sh` makes it).
#
#   bash scripts/ray_nodes.sh up [NODES]   # NODES = 1 or 2 (default 2); prints the address
#   bash scripts/ray_nodes.sh kill N       # SIGKILL every process of node N (N >= 2)
#   bash scripts/ray_nodes.sh down         # stop every node, remove the namespaces and bridge
#
# The core is deployed separately (`voxserve cluster up --address ADDRESS ...`) and the gateway
# is `voxserve serve --cluster ADDRESS`: the same commands as on separate machines.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY="$PWD/.venv/bin/ray"
BRIDGE=vxray0
NET=10.77.0
PORT=6379
ADDRESS="$NET.11:$PORT"
TMP=/tmp/vxray
export RAY_USAGE_STATS_ENABLED=0
# Token auth, as Ray does for a local head; every node, and the deploy and gateway commands
# (RAY_AUTH_MODE=token in their environment), send the token in ~/.ray/auth_token.
export RAY_AUTH_MODE=token

ns() { echo "vxray-n$1"; }

die() { echo "ray_nodes.sh: $*" >&2; exit 2; }

net_up() {
  local nodes=$1 n
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for n in $(seq 1 "$nodes"); do
    ip netns add "$(ns "$n")"
    ip link add "vxray-h$n" type veth peer name eth0 netns "$(ns "$n")"
    ip link set "vxray-h$n" master "$BRIDGE" up
    ip -n "$(ns "$n")" addr add "$NET.1$n/24" dev eth0
    ip -n "$(ns "$n")" link set eth0 up
    ip -n "$(ns "$n")" link set lo up
    ip -n "$(ns "$n")" route add default via "$NET.1"
  done
}

# `ray start` on node N: in its namespace, pinned to its core, with a temp dir of its own
# (sockets and logs of one node never meet another's).
node_start() {
  local n=$1
  shift
  ip netns exec "$(ns "$n")" taskset -c "$((n - 1))" "$RAY" start --node-ip-address "$NET.1$n" \
    --num-cpus 1 --temp-dir "$TMP/n$n" --disable-usage-stats "$@" >"$TMP/n$n.log" 2>&1 \
    || { cat "$TMP/n$n.log" >&2; die "node $n did not start"; }
}

up() {
  local nodes=${1:-2}
  [[ $nodes =~ ^[12]$ ]] || die "NODES is 1 or 2, not '$nodes'"
  [ "$(id -u)" -eq 0 ] || die "needs root: network namespaces (ip netns) and a bridge"
  [ -x "$RAY" ] || die "no $RAY: make the project's .venv first (bash scripts/test.sh)"
  [ "$(nproc)" -ge "$nodes" ] || die "$nodes nodes need $nodes cores; this machine has $(nproc)"
  ip link show "$BRIDGE" >/dev/null 2>&1 && die "already up (bash scripts/ray_nodes.sh down first)"
  mkdir -p "$TMP"
  "$RAY" get-auth-token --generate >/dev/null
  net_up "$nodes"
  node_start 1 --head --port "$PORT" --include-dashboard false
  for n in $(seq 2 "$nodes"); do
    node_start "$n" --address "$ADDRESS"
  done
  # The gateway host's node: no CPUs, so Serve places no replica here. In a session of its
  # own, so that `down` finds every process it started (Ray renames them).
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$TMP/gw.sid" "$RAY" start --address "$ADDRESS" \
    --node-ip-address "$NET.1" --num-cpus 0 --temp-dir "$TMP/gw" --disable-usage-stats \
    >"$TMP/gw.log" 2>&1 || { cat "$TMP/gw.log" >&2; die "gateway node did not start"; }
  echo "$nodes node(s) up at $ADDRESS (node N: namespace $(ns N), address $NET.1N, core N-1)"
  echo "deploy: RAY_AUTH_MODE=token .venv/bin/voxserve cluster up --address $ADDRESS --config FILE"
  echo "serve:  RAY_AUTH_MODE=token .venv/bin/voxserve serve --cluster $ADDRESS --config FILE"
}

kill_node() {
  local n=${1:-}
  [[ $n =~ ^[2-9]$ ]] || die "kill takes a node number >= 2 (node 1 holds the head), not '$n'"
  local pids
  pids=$(ip netns pids "$(ns "$n")" 2>/dev/null) || die "no node $n"
  [ -n "$pids" ] || die "node $n has no process left"
  empty_namespace "$(ns "$n")"
  echo "node $n killed ($(wc -w <<<"$pids") processes)"
}

# SIGKILL every process of namespace $1 and wait until they are gone (the namespace and its
# veth outlive `ip netns del` while a process still holds them).
empty_namespace() {
  local pids
  for _ in $(seq 50); do
    pids=$(ip netns pids "$1")
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    sleep 0.1
  done
  die "processes of $1 outlived SIGKILL: $pids"
}

down() {
  local n
  # Every process of a node lives in its namespace: killing them there leaves the host's
  # other Ray instances (a test run's) alone, which `ray stop` would not.
  for n in $(ip netns list | grep -o 'vxray-n[0-9]*'); do
    empty_namespace "$n"
    ip netns del "$n"
  done
  if [ -f "$TMP/gw.sid" ]; then
    pkill -9 -s "$(cat "$TMP/gw.sid")" || true
  fi
  for n in $(ip -o link show | grep -o 'vxray-h[0-9]*' | sort -u); do
    ip link del "$n" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "$TMP"
  echo "down"
}

case "${1:-}" in
  up) up "${2:-2}" ;;
  kill) kill_node "${2:-}" ;;
  down) down ;;
  *) die "usage: $0 up [NODES] | kill N | down" ;;
esac
