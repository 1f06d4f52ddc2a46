#!/usr/bin/env bash
# Create .venv, install voxserve with its embedded default engines, and start the server
# on 127.0.0.1:8000 (pass other `voxserve serve` flags through, e.g. --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[default]'
exec .venv/bin/voxserve serve --host 127.0.0.1 --port 8000 "$@"
