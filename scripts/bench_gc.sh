#!/bin/bash
# GC pauses under load for one GC setting (docs/benchmarks.md, "GC: freeze and thresholds").
# usage: scripts/bench_gc.sh LABEL THRESHOLDS FREEZE, e.g. scripts/bench_gc.sh tuned "[10000,20,20]" true
# One server with the load engines, 100 paced streams for 20 s, voxserve_gc_pause_seconds after;
# results in /tmp/gcbench/LABEL.*
set -u
mkdir -p /tmp/gcbench
cd "$(dirname "$0")/.."
LABEL=$1; TH=$2; FR=$3
PORT=$(.venv/bin/python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
VOXSERVE_GC__THRESHOLDS="$TH" VOXSERVE_GC__FREEZE_AFTER_LOAD="$FR" VOXSERVE_GRPC_PORT=0 VOXSERVE_WYOMING_PORT=0 \
  .venv/bin/python -m voxserve serve --config bench/load-engines.toml --port $PORT --log-level warning > /tmp/gcbench/$LABEL.server.log 2>&1 &
SPID=$!
for i in $(seq 100); do curl -sf localhost:$PORT/readyz >/dev/null && break; sleep 0.2; done
curl -s localhost:$PORT/metrics | grep '^voxserve_gc_pause_seconds_\(count\|sum\)' > /tmp/gcbench/$LABEL.before
.venv/bin/python -m voxserve bench stream --url ws://127.0.0.1:$PORT --streams 100 --duration 20 --out /tmp/gcbench/$LABEL --quiet > /tmp/gcbench/$LABEL.bench.log 2>&1
curl -s localhost:$PORT/metrics | grep '^voxserve_gc_pause_seconds_\(count\|sum\|bucket\)' > /tmp/gcbench/$LABEL.after
kill -TERM $SPID; wait $SPID
echo "$LABEL done"
