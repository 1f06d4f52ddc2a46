#!/usr/bin/env bash
# The tests that assert words from a model, under each int8 GEMM path CTranslate2 can take on
# this machine (issue 40): oneDNN without VNNI (AVX2, AVX512_CORE), oneDNN as the CPU allows
# (the default; VNNI on AMD EPYC here) and Intel MKL (what Intel CPUs use). A test that passes
# on one and fails on another asserts one CPU's rounding, not the feature. Timing bounds may
# fail under MKL on AMD (2.5x slower there): read the failures, not the count.
#   bash scripts/isa_sweep.sh [pytest paths...]     # default: the word-asserting files below
set -uo pipefail
cd "$(dirname "$0")/.."
FILES=("$@")
if [ "${#FILES[@]}" -eq 0 ]; then
  FILES=(tests/engines/test_whisper_asr.py tests/engines/test_whisper_multilingual.py
    tests/test_http_transcriptions.py tests/test_cli.py tests/transports/test_wyoming_real.py
    tests/transports/test_wyoming_streaming.py tests/transports/test_grpc_real.py
    tests/test_ws_real.py tests/realtime/test_realtime_sdk.py tests/test_bulk_uploads.py
    tests/test_bulk_batched.py tests/test_http_audio.py tests/faults/test_real_engines.py
    tests/test_ws_wake.py tests/hostile/test_engines.py tests/models/test_translations_default.py)
fi
for variant in "X=default" "ONEDNN_MAX_CPU_ISA=AVX2" "ONEDNN_MAX_CPU_ISA=AVX512_CORE" "CT2_USE_MKL=1"; do
  echo "== $variant"
  env "$variant" .venv/bin/python -m pytest -q -p no:cacheprovider "${FILES[@]}" 2>&1 \
    | grep -E "^(FAILED|ERROR)|passed|failed"
done
