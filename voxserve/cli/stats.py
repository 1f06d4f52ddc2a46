"""`voxserve stats`: the per-stage profile of a running server (GET /debug/stats) as a table.

Uses the admin key like `voxserve cache` (VOXSERVE_ADMIN_KEY or --admin-key)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from voxserve.cli.admin_http import add_server_flags
from voxserve.cli.errors import EXIT_OK

if TYPE_CHECKING:
    from voxserve.cli.argtypes import Subparsers


def add_stats_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    stats = commands.add_parser(
        "stats",
        parents=[common],
        help="per-stage latency (mean, P50, P99) of a running server",
        description="Print the per-stage profile of a running server: mean, P50 and P99 "
        "latency of each stage over its last latencies (GET /debug/stats, admin key).",
    )
    stats.set_defaults(handler=cmd_stats)
    add_server_flags(stats, "server to ask (default: http://HOST:PORT from the config)")
    stats.add_argument("--json", action="store_true", help="print the JSON answer")


def cmd_stats(args: argparse.Namespace) -> int:
    from voxserve.cli.admin_http import admin_client, call
    from voxserve.cli.settings import load_cli_settings

    settings = load_cli_settings(args)
    with admin_client(args, settings) as client:
        body = call(client, "GET", "/debug/stats")
    print(json.dumps(body, indent=2) if args.json else format_table(body))
    return EXIT_OK


def format_table(body: dict[str, Any]) -> str:
    """Stages as rows: count, mean, P50, P99, max (ms); then queues and loop stalls."""
    header = f"{'stage':<20} {'count':>7} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}"
    lines = [header, "-" * len(header)]
    for row in body.get("stages", []):
        lines.append(
            f"{row['stage']:<20} {row['count']:>7} {row['mean_ms']:>9.2f} {row['p50_ms']:>9.2f} "
            f"{row['p99_ms']:>9.2f} {row['max_ms']:>9.2f}"
        )
    if len(lines) == 2:
        lines.append("(no latencies observed yet)")
    queues = body.get("queues", {})
    if queues:
        lines.append("")
        lines.append(
            "queues: "
            + ", ".join(
                f"{name} {q['running']}/{q['limit']} running, {q['waiting']} waiting"
                for name, q in queues.items()
            )
        )
    lines.append(
        f"sessions: {body.get('sessions_active', 0)}, loop stalls: {body.get('loop_stalls')}, "
        f"window: last {body.get('window')} per stage"
    )
    return "\n".join(lines)
