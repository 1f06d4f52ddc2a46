"""`voxserve cache stats|invalidate|prewarm|clear`: the TTS cache of a running server through
its admin routes (`--url`, admin key from VOXSERVE_ADMIN_KEY or `--admin-key`), or a cache
directory on disk with no server (`--cache-dir DIR`: stats, invalidate, clear).

Offline writes refuse a directory a server holds (its lock): the server would go on serving
from memory what was deleted on disk. Go through the server (`--url`) instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxserve.cli.admin_http import add_server_flags, admin_client, call
from voxserve.cli.argtypes import action_command
from voxserve.cli.errors import EXIT_OK, EXIT_USAGE, CliError

if TYPE_CHECKING:
    import httpx

    from voxserve.cli.argtypes import Subparsers
    from voxserve.config import Settings

PREWARM_BATCH = 500  # sentences per admin request (far under the 4 MB body limit)
POLL_S = 0.5


def with_cache_dir(settings: Settings, directory: str | None) -> Settings:
    """`--cache-dir DIR` over whatever the config and env say."""
    if directory is None:
        return settings
    cache = settings.cache.model_copy(update={"dir": Path(directory).expanduser()})
    return settings.model_copy(update={"cache": cache})


def add_cache_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    cache_action = action_command(
        commands,
        common,
        "cache",
        cmd_cache,
        help_text="inspect, invalidate, prewarm or clear the TTS cache",
        description="The TTS cache of a running server (through its admin routes, which "
        "need the admin key), or of a cache directory with no server running (--cache-dir).",
    )

    def action(name: str, help_text: str, *, offline: bool) -> argparse.ArgumentParser:
        sub = cache_action(name, help_text)
        add_server_flags(sub, "server to talk to (default: http://HOST:PORT from the config)")
        if offline:
            sub.add_argument(
                "--cache-dir",
                metavar="DIR",
                help="work on this cache directory instead of a server (no server may be "
                "running on it for invalidate and clear)",
            )
        return sub

    stats = action("stats", "entries, bytes, hit ratio, prewarm progress", offline=True)
    stats.add_argument("--json", action="store_true", help="print JSON")
    inval = action("invalidate", "drop entries by voice, by text prefix, or all", offline=True)
    inval.add_argument("--voice", help="entries of this voice")
    inval.add_argument("--text-prefix", metavar="TEXT", help="entries whose text starts so")
    inval.add_argument("--all", action="store_true", help="every entry")
    action("clear", "drop every entry", offline=True)
    prewarm = action("prewarm", "cache the sentences of a file (one a line)", offline=False)
    prewarm.add_argument("file", metavar="FILE", help="UTF-8 text, one sentence or reply a line")
    prewarm.add_argument("--voice", help="voice id (default: the server's default voice)")
    prewarm.add_argument("--speed", type=float, default=1.0, help="speaking rate (default 1)")
    prewarm.add_argument(
        "--sample-rate", type=int, metavar="HZ", help="output rate (default: the server's)"
    )
    prewarm.add_argument(
        "--no-wait", action="store_true", help="return once queued; do not follow progress"
    )


def cmd_cache(args: argparse.Namespace) -> int:
    from voxserve.cli.settings import load_cli_settings

    settings = load_cli_settings(args)
    if getattr(args, "cache_dir", None):
        if args.url:
            raise CliError("give --url or --cache-dir, not both", EXIT_USAGE)
        return _offline(args, Path(args.cache_dir).expanduser())
    return _online(args, settings)


# --- through a running server ---------------------------------------------------------------


def _online(args: argparse.Namespace, settings: Settings) -> int:
    with admin_client(args, settings) as client:
        if args.action == "stats":
            _print_stats(call(client, "GET", "/admin/cache"), as_json=args.json)
        elif args.action == "clear":
            body = call(client, "DELETE", "/admin/cache")
            print(f"cleared {body['cleared']} entries")
        elif args.action == "invalidate":
            body = call(client, "POST", "/admin/cache/invalidate", _invalidation(args))
            print(f"invalidated {body['invalidated']} entries")
        else:
            _prewarm(client, args)
    return EXIT_OK


def _invalidation(args: argparse.Namespace) -> dict[str, Any]:
    if not (args.all or args.voice or args.text_prefix):
        raise CliError("say what to invalidate: --voice, --text-prefix or --all", EXIT_USAGE)
    if args.all:
        return {"all": True}
    return {"voice": args.voice, "text_prefix": args.text_prefix}


def _prewarm(client: httpx.Client, args: argparse.Namespace) -> None:
    path = Path(args.file)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot read it as UTF-8 text ({exc})") from exc
    lines = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise CliError(f"{path}: no sentences in it")
    options: dict[str, Any] = {"speed": args.speed}
    if args.voice:
        options["voice"] = args.voice
    if args.sample_rate:
        options["sample_rate"] = args.sample_rate
    accepted = total = 0
    for start in range(0, len(lines), PREWARM_BATCH):
        batch = lines[start : start + PREWARM_BATCH]
        body = call(client, "POST", "/admin/cache/prewarm", {"sentences": batch, **options})
        accepted += int(body["accepted"])
        total = int(body["total"])
    print(f"queued {accepted} texts from {len(lines)} lines of {path}", flush=True)
    if args.no_wait:
        return
    live = sys.stdout.isatty()  # a terminal gets one line redrawn; a pipe, one per change
    shown = -1
    while True:
        stats = call(client, "GET", "/admin/cache")
        done = int(stats["prewarm_done"])
        ours = min(accepted, max(0, accepted - (total - done)))  # ours were queued last
        if ours != shown:
            line = f"prewarm {ours}/{accepted} ({stats['prewarm_failed']} failed in all)"
            print(f"\r{line}" if live else line, end="" if live else "\n", flush=True)
            shown = ours
        if done >= total:
            break
        time.sleep(POLL_S)
    if live:
        print(flush=True)


# --- a directory, no server -----------------------------------------------------------------


def _offline(args: argparse.Namespace, directory: Path) -> int:
    from voxserve.cache.key import normalise_prefix
    from voxserve.cache.lock import DirLock
    from voxserve.cache.store import Invalidate, SqliteStore

    path = directory / "tts-cache.sqlite3"
    if not path.exists():
        raise CliError(f"{directory}: no TTS cache there (no tts-cache.sqlite3)")
    store = SqliteStore(path)
    lock = DirLock(directory)
    try:
        if args.action == "stats":
            _print_stats(store.summary(time.time()), as_json=args.json)
            return EXIT_OK
        if not lock.acquire():
            raise CliError(
                f"a server is using {directory}; go through it instead (--url): it would "
                "keep serving from memory what is deleted here"
            )
        voice: str | None = None
        prefix: str | None = None
        if args.action == "invalidate" and not _invalidation(args).get("all"):
            voice = args.voice
            prefix = normalise_prefix(args.text_prefix) if args.text_prefix else None
        rows, _ = store.count(voice, prefix)
        store.apply([Invalidate(voice, prefix)])
        print(f"{'cleared' if args.action == 'clear' else 'invalidated'} {rows} entries")
        return EXIT_OK
    finally:
        store.close()
        lock.release()


def _print_stats(stats: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return
    width = max(len(name) for name in stats)
    for name, value in stats.items():
        shown = json.dumps(value) if isinstance(value, dict | list) else value
        print(f"{name:<{width}}  {shown}", file=sys.stdout)
