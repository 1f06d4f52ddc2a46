#!/usr/bin/env bash
# Refresh requirements/test.lock, the resolved and hashed set that scripts/test.sh (and so CI)
# installs (and requirements/uv.lock, the installer it uses): every package of the `dev` extra
# (with `clients`, the agent frameworks of tests/clients), for Python 3.11 on any platform
# (markers), each with the hashes of its files.
# requirements/overrides.txt replaces what a dependency asks where it conflicts with voxserve
# (each with why); scripts/test.sh installs the lock with --no-deps for that reason. Run it on
# purpose (a new dependency, a wanted upgrade), then
# run scripts/test.sh and commit the lock with what it changed. Extra arguments go to
# `uv pip compile` (e.g. `--upgrade-package faster-whisper`); without `--upgrade` the versions
# already locked are kept where they still satisfy pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="${TMPDIR:-/tmp}/voxserve-lock-tools"
[ -x "$TOOLS/bin/uv" ] || { python3 -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q uv; }
"$TOOLS/bin/uv" pip compile pyproject.toml --extra dev --universal --python-version 3.11 \
  --generate-hashes --override requirements/overrides.txt --custom-compile-command "bash scripts/lock.sh" \
  -o requirements/test.lock "$@"
# uv itself, which scripts/test.sh installs with pip and then installs the lock with.
echo uv | "$TOOLS/bin/uv" pip compile - --universal --python-version 3.11 --generate-hashes \
  --custom-compile-command "bash scripts/lock.sh" --quiet -o requirements/uv.lock
