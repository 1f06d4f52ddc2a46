"""`voxserve models list|pull|rm`: the models on this host by name (engines/model_store.py),
or, with `--url`, those of a running server through its `/admin/models` routes (admin key,
like `voxserve cache`).

`pull` fetches ahead (a container image, an air-gapped host's cache filled elsewhere): each
model resumes where an earlier pull stopped and is checked against the Hub's checksums;
progress goes to stderr, one line per failed name, exit 1 if any failed. A model already
complete in the cache costs no request. Offline (HF_HUB_OFFLINE=1) a pull refuses at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from voxserve.cli.admin_http import add_server_flags
from voxserve.cli.argtypes import action_command
from voxserve.cli.errors import EXIT_FAILURE, EXIT_OK, PROG, CliError

if TYPE_CHECKING:
    from voxserve.cli.argtypes import Subparsers
    from voxserve.engines.hub import Progress

POLL_S = 0.5


def add_models_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    models_action = action_command(
        commands,
        common,
        "models",
        cmd_models,
        help_text="list, pull or remove models (Whisper, Piper voices, CosyVoice) by name",
        description="The models on this host: packaged ones and those in the Hugging Face "
        "cache (HF_HOME). With --url, a running server's, through /admin/models (admin key).",
    )

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = models_action(name, help_text)
        add_server_flags(
            sub,
            "work on a running server's models instead (admin key)",
            "admin key with --url (default: VOXSERVE_ADMIN_KEY; prefer it, flags show in ps)",
        )
        return sub

    listing = action("list", "installed models: name, kind, engine, size, licence, where, source")
    listing.add_argument("--json", action="store_true", help="print JSON")
    pull = action(
        "pull", "download models ahead into the model cache (resumable, checksums verified)"
    )
    pull.add_argument(
        "names",
        nargs="+",
        metavar="NAME",
        help="small.en, large-v3, Systran/faster-whisper-small, en_GB-alba-medium, "
        "FunAudioLLM/CosyVoice2-0.5B, ...",
    )
    pull.add_argument("--no-wait", action="store_true", help="with --url: return once queued")
    # How a server runs a pull (server/http/model_pulls.py): names as the network may give them
    # (no local paths), progress and outcomes as JSON lines on stdout.
    pull.add_argument("--json-lines", action="store_true", help=argparse.SUPPRESS)
    remove = action("rm", "remove a downloaded model from the model cache")
    remove.add_argument("name", metavar="NAME", help="the model's name, as `list` shows it")


def cmd_models(args: argparse.Namespace) -> int:
    if args.url:
        return _online(args)
    if args.action == "list":
        return _list(args)
    if args.action == "pull":
        return _pull(args.names, json_lines=args.json_lines)
    return _remove(args.name)


# --- this host ------------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    from voxserve.engines.model_store import installed

    rows = [row.as_dict() for row in installed()]
    if args.json:
        print(json.dumps({"models": rows}, indent=2, ensure_ascii=False))
    else:
        print(models_table(rows))
    return EXIT_OK


def _pull(names: list[str], *, json_lines: bool = False) -> int:
    from voxserve.engines import model_store

    offline = _offline()
    failed = 0
    for name in dict.fromkeys(names):
        try:
            ref = model_store.resolve(name, allow_local=not json_lines)
            if ref.source != "hub":
                _say(json_lines, ref.name, _not_pulled(ref.source))
                continue
            started = time.monotonic()
            shown = _JsonProgress(ref.name) if json_lines else _ProgressLine(ref.name)
            pulled = model_store.pull(ref, offline=offline, on_progress=shown)
        except Exception as exc:
            failed += 1
            print(f"{PROG}: error: {_shown(name)}: {_one_line(exc)}", file=sys.stderr, flush=True)
            if json_lines:
                print(json.dumps({"name": name, "error": _one_line(exc)}), flush=True)
            continue
        if json_lines:
            print(json.dumps({"name": ref.name, "fetched": pulled.fetched}), flush=True)
            continue
        if pulled.fetched:
            seconds = time.monotonic() - started
            print(f"{ref.name}: pulled into {pulled.path} in {seconds:.1f} s")
        else:
            print(f"{ref.name}: already downloaded ({pulled.path})")
        # Resolved again: a model's licence is known once its card is in the cache.
        with contextlib.suppress(Exception):
            ref = model_store.resolve(ref.name, allow_local=True)
        if ref.non_commercial:
            print(f"{ref.name}: note: licensed {ref.licence}: non-commercial use only")
    return EXIT_FAILURE if failed else EXIT_OK


def _say(json_lines: bool, name: str, text: str) -> None:
    """A model with nothing to fetch: a line, or (for a server) a pull that fetched nothing."""
    if json_lines:
        print(json.dumps({"name": name, "fetched": False}), flush=True)
    else:
        print(f"{name}: {text}")


def _remove(name: str) -> int:
    from voxserve.engines import model_store

    try:
        ref = model_store.resolve(name, allow_local=True)
        freed = model_store.remove(ref)
    except (model_store.NotRemovable, model_store.UnknownModel, model_store.BadModelName) as exc:
        raise CliError(_one_line(exc)) from None
    print(f"{ref.name}: removed ({_size(freed)} freed)")
    return EXIT_OK


def _offline() -> bool:
    from voxserve.engines import hub

    return hub.hub_offline()


def _not_pulled(source: str) -> str:
    if source == "package":
        return "packaged (installed with its Python package); nothing to pull"
    return "a local directory; nothing to pull"


def _shown(name: str) -> str:
    """A name as an error line starts with it: whole when short and printable, else quoted
    and cut (one line, whatever was typed)."""
    from voxserve.errors import quoted

    return name if name.isprintable() and len(name) <= 80 else quoted(name)


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


class _ProgressLine:
    """A pull's progress on stderr when it is not a terminal (a log, a Docker build): a
    line per tenth. A terminal has huggingface_hub's own bar."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.quiet = sys.stderr.isatty()
        self.tenth = -1

    def __call__(self, progress: Progress) -> None:
        total = max(0, progress.total_bytes)
        if self.quiet or not total:
            return
        done = min(progress.done_bytes, total)
        tenth = done * 10 // total
        if tenth > self.tenth:
            self.tenth = tenth
            print(
                f"{self.name}: {_size(done)} of {_size(total)} ({tenth * 10}%)",
                file=sys.stderr,
                flush=True,
            )


class _JsonProgress:
    """Progress as JSON lines for the server that runs the pull, at most every 0.2 s and
    at the end."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.shown_at = 0.0

    def __call__(self, progress: Progress) -> None:
        now = time.monotonic()
        if now - self.shown_at < 0.2 and progress.done_bytes < progress.total_bytes:
            return
        self.shown_at = now
        line = {"done_bytes": progress.done_bytes, "total_bytes": progress.total_bytes}
        print(json.dumps({"name": self.name, **line}), flush=True)


# --- a running server -----------------------------------------------------------------------


def _online(args: argparse.Namespace) -> int:
    from urllib.parse import quote

    from voxserve.cli.admin_http import admin_client, call
    from voxserve.cli.settings import load_cli_settings

    settings = load_cli_settings(args)
    with admin_client(args, settings) as client:
        if args.action == "list":
            body = call(client, "GET", "/admin/models")
            if args.json:
                print(json.dumps(body, indent=2, ensure_ascii=False))
            else:
                print(models_table(body.get("models", [])))
            return EXIT_OK
        if args.action == "rm":
            body = call(client, "DELETE", f"/admin/models/{quote(args.name, safe='/')}")
            print(f"{body['name']}: removed ({_size(int(body['freed_bytes']))} freed)")
            return EXIT_OK
        names = list(dict.fromkeys(args.names))
        body = call(client, "POST", "/admin/models/pull", {"names": names})
        if args.no_wait:
            print(f"queued: {', '.join(p['name'] for p in body['pulls'])}")
            return EXIT_OK
        return _follow(client, [p["name"] for p in body["pulls"]])


def _follow(client: Any, names: list[str]) -> int:
    """Poll GET /admin/models/pull until every pull of `names` ended; report each."""
    from voxserve.cli.admin_http import call

    pending = set(names)
    failed = 0
    while pending:
        latest: dict[str, dict[str, Any]] = {}
        for state in call(client, "GET", "/admin/models/pull").get("pulls", []):
            latest.setdefault(str(state.get("name")), state)  # in flight first, then newest
        for name, state in latest.items():
            if name not in pending:
                continue
            if state.get("state") in ("queued", "running"):
                if state.get("total_bytes"):
                    done, total = int(state["done_bytes"]), int(state["total_bytes"])
                    print(f"{name}: {_size(done)} of {_size(total)}", file=sys.stderr, flush=True)
                continue
            pending.discard(name)
            if state["state"] == "failed":
                failed += 1
                print(f"{PROG}: error: {name}: {state.get('error')}", file=sys.stderr, flush=True)
            else:
                print(f"{name}: {'pulled' if state.get('fetched') else 'already downloaded'}")
        for name in pending - latest.keys():  # pushed out of the server's last outcomes
            pending.discard(name)
            failed += 1
            print(f"{PROG}: error: {name}: its outcome is no longer listed", file=sys.stderr)
        if pending:
            time.sleep(POLL_S)
    return EXIT_FAILURE if failed else EXIT_OK


# --- the table ------------------------------------------------------------------------------


def models_table(rows: list[dict[str, Any]]) -> str:
    """The text `list` prints: one model a line, non-commercial ones marked, then a note."""
    if not rows:
        return "no models installed"
    header = ("NAME", "KIND", "ENGINE", "SIZE", "SOURCE", "LICENCE", "WHERE")
    table = [
        (
            str(row["name"]) + ("" if row.get("complete", True) else " (partial)"),
            str(row["kind"]),
            str(row["engine"]),
            _size(int(row["size_bytes"])),
            _source(row),
            str(row["licence"]) + (" [non-commercial]" if row.get("non_commercial") else ""),
            str(row["path"]),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in (header, *table)) for i in range(len(header) - 1)]
    lines = [
        "  ".join([*(cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True)), line[-1]])
        for line in (header, *table)
    ]
    flagged = [str(row["name"]) for row in rows if row.get("non_commercial")]
    if flagged:
        lines.append(f"note: non-commercial use only: {', '.join(flagged)}")
    if any(not row.get("complete", True) for row in rows):
        lines.append("note: (partial): a pull stopped part way; pull it again to resume")
    return "\n".join(lines)


def _source(row: dict[str, Any]) -> str:
    """ "hub", "local", or the package a packaged model comes with."""
    if row["source"] == "package" and row.get("package"):
        return f"package {row['package']}"
    return str(row["source"])


def _size(size: int) -> str:
    if size >= 1_000_000_000:
        return f"{size / 1e9:.1f} GB"
    if size >= 1_000_000:
        return f"{size / 1e6:.1f} MB"
    if size >= 1_000:
        return f"{size / 1e3:.1f} kB"
    return f"{size} B"
