"""The branch coverage of the parts that must stay well tested, from the data the last
`pytest --cov` run left in .coverage (scripts/test.sh runs it after the suite):

    .venv/bin/python scripts/coverage_areas.py

Prints lines, branches and coverage's combined figure for the package, the pipeline, and
each wire parser (bytes or text from a client, parsed before anything trusts it).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import coverage
from coverage.exceptions import NoDataError

PIPELINE = ["voxserve/pipeline/*"]
WIRE_PARSERS = [
    "voxserve/server/session/stream_protocol.py",
    "voxserve/server/websocket/fastpath.py",  # feeds the splitter, hands other frames to websockets
    "voxserve/server/websocket/frames.py",  # the fast path's frame splitter
    "voxserve/server/session/json_input.py",
    "voxserve/server/grpc/codec.py",
    "voxserve/server/wyoming/protocol.py",
]


def totals(cov: coverage.Coverage, include: list[str]) -> dict[str, dict[str, float]]:
    """Per-file and overall figures (coverage's JSON report) for the files `include` matches."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "coverage.json")
        try:
            cov.json_report(include=include, outfile=str(out))
        except NoDataError:
            return {}
        report = json.loads(out.read_text())
    found = {name: data["summary"] for name, data in report["files"].items()}
    found["total"] = report["totals"]
    return found


def row(name: str, figures: dict[str, float]) -> str:
    lines = f"{figures['covered_lines']}/{figures['num_statements']}"
    branches = f"{figures['covered_branches']}/{figures['num_branches']}"
    branch_pct = 100 * figures["covered_branches"] / max(figures["num_branches"], 1)
    return (
        f"  {name:<40} {lines:>12} {branches:>12} {branch_pct:>7.1f}% "
        f"{figures['percent_covered']:>7.1f}%"
    )


def main() -> int:
    cov = coverage.Coverage()
    cov.load()
    package = totals(cov, ["voxserve/*"])
    if not package:
        print("coverage: no data (run the suite with --cov first)", file=sys.stderr)
        return 1
    pipeline = totals(cov, PIPELINE)
    parsers = totals(cov, WIRE_PARSERS)
    print(f"  {'branch coverage':<40} {'lines':>12} {'branches':>12} {'branch':>8} {'all':>8}")
    print(row("voxserve (package)", package["total"]))
    print(row("voxserve/pipeline/", pipeline["total"]))
    print(row("wire parsers", parsers["total"]))
    for name in sorted(parsers):
        if name != "total":
            print(row("  " + name.removeprefix("voxserve/"), parsers[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
