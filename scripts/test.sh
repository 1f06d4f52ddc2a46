#!/usr/bin/env bash
# Set up .venv with the engines and test tools, then run every check the project requires:
# ruff (lint + format), mypy --strict over the package, and the pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
.venv/bin/ruff check voxserve tests scripts
.venv/bin/ruff format --check voxserve tests scripts
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
