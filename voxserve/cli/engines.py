"""`voxserve engines [reload]`: the engine report (no action), or a hot reload of a running
server's engines through POST /admin/engines/reload (admin key, like `voxserve cache`).

A reload loads new engines while streams run: new sessions use them at once, live sessions
finish on the engines they started with (docs/architecture.md, "Hot engine reload").
"""

from __future__ import annotations

import argparse
import json

from voxserve.cli.admin_http import add_server_flags
from voxserve.cli.engines_report import cmd_engines
from voxserve.cli.errors import EXIT_OK


def add_engines_arguments(engines: argparse.ArgumentParser) -> None:
    """The reload action and its flags, on the existing `engines` command."""
    engines.add_argument(
        "action",
        nargs="?",
        choices=["reload"],
        help="reload: load new engines into a running server (SIGHUP does the same)",
    )
    engines.add_argument(
        "--kinds",
        metavar="KINDS",
        help="reload only these kinds, comma-separated: vad,asr,tts,responder (default all)",
    )
    add_server_flags(engines, "server to reload (default: http://HOST:PORT of the config)")


def cmd_engines_action(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) != "reload":
        return cmd_engines(args)
    from voxserve.cli.admin_http import admin_client, call
    from voxserve.cli.settings import load_cli_settings

    settings = load_cli_settings(args)
    body: dict[str, object] = {}
    if args.kinds:
        body["kinds"] = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    with admin_client(args, settings) as client:
        answer = call(client, "POST", "/admin/engines/reload", body)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(
            f"engines reloaded: generation {answer['previous']} -> {answer['generation']} "
            f"({', '.join(answer['kinds'])}); live sessions finish on the generation they "
            "started on"
        )
    return EXIT_OK
