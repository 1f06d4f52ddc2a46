"""The `voxserve` command: serve, say, transcribe, engines.

Every failure a user can cause or fix (bad config, missing file, busy port, missing optional
engines) ends as ONE line on stderr, ``voxserve: error: ...``, and a non-zero exit code;
``--verbose`` adds the traceback. Heavy modules (models, uvicorn) are imported inside the
commands so ``voxserve --help`` answers at once.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import errno
import importlib.util
import json
import logging
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from voxserve import __version__

if TYPE_CHECKING:
    from voxserve.config import Settings
    from voxserve.runtime import Runtime

log = logging.getLogger("voxserve.cli")

PROG = "voxserve"
EXTRA_HINT = "pip install -e '.[default]'"
KINDS = ("vad", "asr", "tts", "responder")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad flags or bad configuration, as argparse uses
EXIT_INTERRUPTED = 130


def import_hint(exc: ImportError) -> str:
    """The install command, when what is missing is a third-party package (not voxserve)."""
    missing = (exc.name or "").split(".")[0]
    if missing == PROG:
        return "voxserve itself looks incomplete; reinstall it"
    return f"the default engines need the optional extra: {EXTRA_HINT}"


class CliError(Exception):
    """A failure the user can act on; `main` prints it as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- entry point ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code: 0 ok, 1 failure, 2 usage or config error,
    130 interrupted. Errors are printed, not raised, so scripts get one stderr line."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: keep argparse's codes
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    verbose = bool(getattr(args, "verbose", False))
    try:
        code: int = args.handler(args)
        return code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if verbose:
            traceback.print_exc()
        print(f"{PROG}: error: {describe_error(exc)}", file=sys.stderr, flush=True)
        return exit_code_for(exc)


def describe_error(exc: BaseException) -> str:
    """One line a user can act on, for any exception the commands let through."""
    from voxserve.config import ConfigError
    from voxserve.engines.registry import EngineNotFound
    from voxserve.errors import VoxError

    if isinstance(exc, CliError | ConfigError | EngineNotFound):
        text = str(exc)
    elif isinstance(exc, VoxError):
        text = f"{exc.code.value}: {exc.message}"
    elif isinstance(exc, ImportError):
        text = f"cannot import {exc.name or 'a module'} ({exc}); {import_hint(exc)}"
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    # One line, and no dangling colon when an exception had no message of its own.
    return " ".join(text.split()).rstrip(" :")


def exit_code_for(exc: BaseException) -> int:
    from voxserve.config import ConfigError
    from voxserve.engines.registry import EngineNotFound

    if isinstance(exc, CliError):
        return exc.exit_code
    if isinstance(exc, ConfigError | EngineNotFound):
        return EXIT_USAGE
    return EXIT_FAILURE


# --- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # Options every command takes; SUPPRESS keeps a subcommand from resetting a value
    # given before the command name (`voxserve --verbose say ...`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show tracebacks and info logs",
    )
    common.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="TOML or JSON config file (VOXSERVE_* env vars and flags override it)",
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Serve speech models (VAD, ASR, responder, TTS) to live audio streams.",
        epilog="Run 'voxserve COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    parser.add_argument("--config", metavar="FILE", help="TOML or JSON config file")
    commands = parser.add_subparsers(title="commands", dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="run the server (WebSocket /v1/stream and OpenAI-compatible HTTP)",
        description="Run the server. Models load in the background; /healthz answers at "
        "once and /readyz turns 200 when every engine is loaded.",
    )
    serve.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 8000; 0 picks a free one)")
    serve.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="log level (default info)",
    )
    serve.add_argument(
        "--log-format",
        choices=["json", "text"],
        default="json",
        help="JSON lines (default) or human-readable text on stderr",
    )
    serve.set_defaults(handler=cmd_serve)

    say = commands.add_parser(
        "say",
        parents=[common],
        help="synthesise text to a WAV file",
        description="Synthesise TEXT with the configured TTS engines and write a WAV file.",
    )
    say.add_argument("text", metavar="TEXT", help="text to speak ('-' reads standard input)")
    say.add_argument("-o", "--output", required=True, metavar="FILE", help="WAV file to write")
    say.add_argument("--voice", help="voice id (default: the configured default voice)")
    say.add_argument("--speed", type=float, default=1.0, help="speaking rate, 0.25-4 (default 1)")
    say.add_argument(
        "--sample-rate",
        type=int,
        metavar="HZ",
        help="output sample rate (default tts.output_sample_rate, 16000)",
    )
    say.set_defaults(handler=cmd_say)

    transcribe = commands.add_parser(
        "transcribe",
        parents=[common],
        help="transcribe a WAV file",
        description="Transcribe a 16-bit PCM WAV file with the configured ASR engine.",
    )
    transcribe.add_argument("file", metavar="FILE", help="WAV file (16-bit PCM, any rate)")
    transcribe.add_argument("--language", help="language code (default: the engine decides)")
    transcribe.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help="plain text (default) or JSON with segments",
    )
    transcribe.set_defaults(handler=cmd_transcribe)

    engines = commands.add_parser(
        "engines",
        parents=[common],
        help="list the registered engines, their packages, versions and licences",
        description="List every registered engine per kind with its package, version and "
        "licence, and which ones the config selects. Without --load no model is loaded.",
    )
    engines.add_argument(
        "--load", action="store_true", help="load each engine; report load time, model, voices"
    )
    engines.add_argument("--json", action="store_true", help="print JSON instead of text")
    engines.set_defaults(handler=cmd_engines)
    return parser


# --- shared helpers -------------------------------------------------------------------------


def load_cli_settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Settings for a command: defaults < config file < VOXSERVE_* env < flags."""
    from pydantic_settings import SettingsError

    from voxserve.config import ConfigError, load_settings
    from voxserve.observe.logs import parse_level

    try:
        settings = load_settings(getattr(args, "config", None), **overrides)
    except SettingsError as exc:  # e.g. a VOXSERVE_* nested value that is not valid JSON
        raise ConfigError(f"invalid environment setting: {exc}") from exc
    try:
        parse_level(settings.log_level)
    except ValueError as exc:
        raise ConfigError(f"invalid setting log_level: {exc}") from exc
    return settings


def configure_cli_logging(args: argparse.Namespace) -> None:
    """Quiet by default (stdout is the command's output); --verbose shows info logs."""
    from voxserve.observe.logs import configure_logging

    verbose = bool(getattr(args, "verbose", False))
    configure_logging("info" if verbose else "error", json_format=False)


def selected_engines(settings: Settings) -> list[tuple[str, str]]:
    cfg = settings.engines
    return [
        ("vad", cfg.vad.name),
        ("asr", cfg.asr.name),
        *(("tts", spec.name) for spec in cfg.tts),
        ("responder", cfg.responder.name),
    ]


def check_engines_import(settings: Settings) -> None:
    """Import the configured engines' classes now, so a missing optional package is one
    clear line before anything starts, not a failure deep inside model loading."""
    from voxserve.engines.registry import engine_class

    for kind, name in selected_engines(settings):
        try:
            engine_class(kind, name)
        except ImportError as exc:
            raise CliError(
                f"the {kind} engine {name!r} cannot be imported ({exc}); {import_hint(exc)}"
            ) from exc


def load_runtime(settings: Settings) -> Runtime:
    from voxserve.runtime import Runtime, load_engines

    return Runtime.from_engines(settings, load_engines(settings))


# --- serve ----------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Stopping the server is the normal way to end it: SIGINT or SIGTERM, at any point
    (starting, loading, serving), exits 0 after a graceful shutdown."""
    with _sigterm_interrupts():
        try:
            return _serve(args)
        except KeyboardInterrupt:  # uvicorn re-raises the signal after shutting down
            return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    from voxserve.observe.logs import configure_logging
    from voxserve.runtime import Runtime
    from voxserve.server.serve import serve

    settings = load_cli_settings(args, host=args.host, port=args.port, log_level=args.log_level)
    json_logs = args.log_format == "json"
    configure_logging(settings.log_level, json_format=json_logs)
    check_engines_import(settings)
    sockets = bind_sockets(settings.host, settings.port)
    try:
        port = sockets[0].getsockname()[1]
        print(connect_line(settings.host, port), flush=True)
        serve(settings, Runtime(settings), sockets)
    except SystemExit as exc:  # uvicorn exits with 1 when startup fails (logged above)
        if exc.code in (0, None):
            return EXIT_OK
        raise CliError("the server failed to start; see the log lines above") from exc
    finally:
        for sock in sockets:
            sock.close()
    return EXIT_OK


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Bind (and listen on) every address `host` resolves to, as uvicorn would.

    Binding here, before uvicorn starts, turns a busy port into one clear line instead of
    uvicorn's log-and-exit, and handing the bound sockets to uvicorn leaves no race."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise CliError(f"cannot resolve host {host!r}: {exc.strerror}", EXIT_USAGE) from exc
    sockets: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # every address on the port the first got
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            try:
                sock.bind(address)
            except OSError as exc:
                where = f"{host}:{port}"
                if exc.errno == errno.EADDRINUSE:
                    raise CliError(
                        f"port {port} is already in use on {host}; stop the other server "
                        "or choose another port with --port"
                    ) from exc
                raise CliError(f"cannot listen on {where}: {exc.strerror}") from exc
            sock.listen(2048)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def connect_line(host: str, port: int) -> str:
    """Where a client connects: a wildcard host is shown as the loopback address."""
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in shown:
        shown = f"[{shown}]"
    base = f"http://{shown}:{port}"
    also = "" if shown == host else f" (all interfaces: {host or '*'})"
    return (
        f"{PROG} listening on {base}{also} (WebSocket ws://{shown}:{port}/v1/stream, "
        f"OpenAI base_url {base}/v1); models loading, /readyz turns 200 when ready"
    )


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C. While uvicorn runs it handles both signals (graceful
    shutdown), then re-raises the signal with the handler it found: this one, so SIGTERM
    ends as KeyboardInterrupt too, not as death by signal."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- say ------------------------------------------------------------------------------------


def cmd_say(args: argparse.Namespace) -> int:
    from voxserve.audio.resample import check_rate
    from voxserve.audio.wav import write_wav
    from voxserve.pipeline.synthesis import check_speed, check_text
    from voxserve.types import SUPPORTED_OUTPUT_RATES

    settings = load_cli_settings(args)
    configure_cli_logging(args)
    text = sys.stdin.read() if args.text == "-" else args.text
    # Everything checkable without models is checked before spending seconds loading them.
    text = check_text(text, settings.limits.max_text_chars)
    check_speed(args.speed)
    rate = check_rate(args.sample_rate or settings.tts.output_sample_rate, SUPPORTED_OUTPUT_RATES)
    output = Path(args.output)
    if not output.parent.is_dir():
        raise CliError(f"{output.parent}: no such directory for the output file")
    check_engines_import(settings)
    runtime = load_runtime(settings)
    try:
        voice = runtime.engines.voice(args.voice)[0].id
        samples, first_s, total_s = asyncio.run(
            _synthesize(runtime, text, voice=voice, speed=args.speed, sample_rate=rate)
        )
    finally:
        runtime.close()
    if samples.size == 0:
        raise CliError(f"voice {voice!r} produced no audio for this text")
    output.write_bytes(write_wav(samples, rate))
    print(
        f"wrote {output}: {samples.size / rate:.2f} s of audio at {rate} Hz (voice {voice}); "
        f"first chunk after {first_s * 1000:.0f} ms, synthesis took {total_s:.2f} s"
    )
    return EXIT_OK


async def _synthesize(
    runtime: Runtime, text: str, *, voice: str, speed: float, sample_rate: int
) -> tuple[Any, float, float]:
    """synthesize_all, but timing the first chunk (what a streaming client waits for)."""
    import numpy as np

    from voxserve.pipeline.synthesis import synthesize

    started = time.perf_counter()
    first: float | None = None
    chunks = []
    async for chunk in synthesize(runtime, text, voice=voice, speed=speed, sample_rate=sample_rate):
        if first is None:
            first = time.perf_counter() - started
        chunks.append(chunk)
    total = time.perf_counter() - started
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    return samples, first if first is not None else total, total


# --- transcribe -----------------------------------------------------------------------------


def cmd_transcribe(args: argparse.Namespace) -> int:
    from voxserve.audio.wav import read_wav
    from voxserve.pipeline.recognition import transcribe

    settings = load_cli_settings(args)
    configure_cli_logging(args)
    path = Path(args.file)
    if path.is_dir():
        raise CliError(f"{path}: is a directory, not a WAV file")
    samples, rate = read_wav(path.read_bytes())  # before loading models: fail fast
    check_engines_import(settings)
    runtime = load_runtime(settings)
    try:
        result = asyncio.run(transcribe(runtime, samples, rate, language=args.language))
    finally:
        runtime.close()
    if args.format == "json":
        body = {
            "text": result.text.strip(),
            "language": result.language,
            "duration_s": round(samples.size / rate, 3),
            "segments": [
                {
                    "text": seg.text.strip(),
                    "start": round(seg.start_ms / 1000, 3),
                    "end": round(seg.end_ms / 1000, 3),
                }
                for seg in result.segments
            ],
        }
        print(json.dumps(body, ensure_ascii=False))
    else:
        print(result.text.strip())
    return EXIT_OK


# --- engines --------------------------------------------------------------------------------


def cmd_engines(args: argparse.Namespace) -> int:
    from voxserve.engines.registry import engine_names, entry_point_of

    settings = load_cli_settings(args)
    configure_cli_logging(args)
    selected = set(selected_engines(settings))
    options = _engine_options(settings)
    report: dict[str, list[dict[str, Any]]] = {}
    failed_selected: list[str] = []
    for kind in KINDS:
        rows = report.setdefault(kind, [])
        for name in engine_names(kind):
            ep = entry_point_of(kind, name)
            if ep is None:
                continue
            row = _describe_entry_point(kind, name, ep)
            row["selected"] = (kind, name) in selected
            if args.load and row["imports"]:
                row["loaded"] = _load_one(kind, name, options.get((kind, name), {}), settings)
            ok = row["imports"] and "error" not in row.get("loaded", {})
            if row["selected"] and not ok:
                failed_selected.append(f"{kind}.{name}")
            rows.append(row)
    notes = _licence_notes(report)
    if args.json:
        body = {
            "engines": report,
            "selected": {
                "vad": settings.engines.vad.name,
                "asr": settings.engines.asr.name,
                "tts": [spec.name for spec in settings.engines.tts],
                "responder": settings.engines.responder.name,
            },
            "notes": notes,
        }
        print(json.dumps(body, indent=2, ensure_ascii=False))
    else:
        print(_engines_text(report, notes))
    # Listing always succeeds; --load is a check of the install, so it fails when a
    # configured engine does not load.
    return EXIT_FAILURE if args.load and failed_selected else EXIT_OK


def _engine_options(settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    cfg = settings.engines
    found: dict[tuple[str, str], dict[str, Any]] = {
        ("vad", cfg.vad.name): dict(cfg.vad.options),
        ("asr", cfg.asr.name): dict(cfg.asr.options),
        ("responder", cfg.responder.name): dict(cfg.responder.options),
    }
    for spec in cfg.tts:
        found[("tts", spec.name)] = dict(spec.options)
    return found


def _describe_entry_point(kind: str, name: str, ep: Any) -> dict[str, Any]:
    """Package, version and licence from metadata, and whether the class imports.

    No model is loaded: `uses` comes from reading the engine module's imports."""
    dist: Distribution | None = getattr(ep, "dist", None)
    row: dict[str, Any] = {
        "kind": kind,
        "name": name,
        "entry_point": ep.value,
        "package": dist.name if dist is not None else "unknown",
        "version": dist.version if dist is not None else "unknown",
        "license": dist_license(dist) if dist is not None else "unknown",
        "uses": module_distributions(ep.module, exclude=dist.name if dist else None),
    }
    try:
        ep.load()
    except Exception as exc:
        row["imports"] = False
        hint = f"; {import_hint(exc)}" if isinstance(exc, ImportError) else ""
        row["import_error"] = " ".join(f"{type(exc).__name__}: {exc}{hint}".split())
    else:
        row["imports"] = True
    return row


def _load_one(kind: str, name: str, options: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Construct one engine as the runtime would, report what it says, then close it."""
    from voxserve.engines.base import close_engine
    from voxserve.engines.registry import engine_class

    options = dict(options)
    if kind != "responder":
        options.setdefault("threads", settings.engines.default_threads)
    started = time.perf_counter()
    try:
        engine = engine_class(kind, name)(**options)
    except Exception as exc:
        return {"error": " ".join(f"{type(exc).__name__}: {exc}".split())}
    seconds = time.perf_counter() - started
    try:
        info = engine.info
        loaded: dict[str, Any] = {
            "seconds": round(seconds, 3),
            "package": info.package,
            "version": info.version,
            "license": info.license,
            "model": info.model,
        }
        if kind == "tts":
            loaded["sample_rate"] = engine.sample_rate
            loaded["voices"] = [
                {
                    "id": v.id,
                    "language": v.language,
                    "sample_rate": v.sample_rate,
                    "description": v.description,
                }
                for v in engine.voices()
            ]
        if kind == "asr":
            loaded["languages"] = list(engine.languages)
        return loaded
    finally:
        close_engine(engine)


def dist_license(dist: Distribution) -> str:
    """The licence a distribution declares: License-Expression, License, or a classifier."""
    meta = dist.metadata
    expression = (meta.get_all("License-Expression") or [""])[0]
    if expression:
        return str(expression).strip()
    text = str((meta.get_all("License") or [""])[0]).strip()
    if text and text.upper() != "UNKNOWN":
        first = text.splitlines()[0].strip()
        return first if len(first) <= 80 else first[:77] + "..."
    classifiers = [
        c.split("::")[-1].strip()
        for c in (meta.get_all("Classifier") or [])
        if c.startswith("License ::")
    ]
    if classifiers:
        return ", ".join(classifiers)
    return "not declared"


def module_distributions(module: str, exclude: str | None = None) -> list[dict[str, str]]:
    """Third-party distributions an engine module imports (following voxserve's own
    modules), found by reading the source: nothing is imported and no model is loaded.

    voxserve's core dependencies are left out: they are always installed and are not what
    an engine choice adds to the licence picture."""
    from importlib.metadata import packages_distributions

    by_module = packages_distributions()
    skip = {_norm(PROG), *(_norm(d) for d in _core_requirements())}
    if exclude:
        skip.add(_norm(exclude))
    found: dict[str, dict[str, str]] = {}
    for top in sorted(_imported_top_modules(module)):
        for dist_name in by_module.get(top, []):
            if _norm(dist_name) in skip or _norm(dist_name) in found:
                continue
            try:
                dist = distribution(dist_name)
            except PackageNotFoundError:
                continue
            found[_norm(dist_name)] = {
                "package": dist.name,
                "version": dist.version,
                "license": dist_license(dist),
            }
    return list(found.values())


def _imported_top_modules(module: str) -> set[str]:
    tops: set[str] = set()
    seen: set[str] = set()
    pending = [module]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            spec = importlib.util.find_spec(current)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        try:
            tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for name in names:
                top = name.split(".")[0]
                if top == "voxserve":
                    pending.append(name)
                elif top not in sys.stdlib_module_names:
                    tops.add(top)
    return tops


def _core_requirements() -> list[str]:
    """Names in voxserve's own Requires-Dist that are not behind an extra."""
    import re

    try:
        requires = distribution(PROG).requires or []
    except PackageNotFoundError:
        return []
    names = []
    for req in requires:
        if "extra ==" in req:
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
        if match:
            names.append(match.group())
    return names


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _licence_notes(report: dict[str, list[dict[str, Any]]]) -> list[str]:
    """GPL (copyleft) packages and packages that declare no licence, named once each."""
    voxserve_licence = "unknown"
    with contextlib.suppress(PackageNotFoundError):
        voxserve_licence = dist_license(distribution(PROG))
    copyleft: dict[str, list[str]] = {}  # "<what> is <licence>" -> engines using it
    undeclared: dict[str, list[str]] = {}
    for kind, rows in report.items():
        for row in rows:
            engine = f"{kind} engine {row['name']}"
            for dep in row["uses"]:
                key = f"{dep['package']} {dep['version']}"
                if "GPL" in dep["license"].upper():
                    copyleft.setdefault(f"{key} is {dep['license']}", []).append(engine)
                elif dep["license"] == "not declared":
                    undeclared.setdefault(key, []).append(engine)
            reported = str(row.get("loaded", {}).get("license", ""))
            if "GPL" in reported.upper() and not any(
                "GPL" in d["license"].upper() for d in row["uses"]
            ):
                copyleft.setdefault(f"the {engine} reports licence {reported}", [])
    notes = []
    for what, users in copyleft.items():
        used_by = f" (used by the {', '.join(users)})" if users else ""
        notes.append(
            f"{what}{used_by}: it is installed only with the optional 'default' extra, so "
            f"the core voxserve package stays {voxserve_licence}; distributing it means "
            "meeting the GPL's terms"
        )
    notes += [
        f"{what} declares no licence in its package metadata (used by the "
        f"{', '.join(users)}); check it before distributing"
        for what, users in undeclared.items()
    ]
    return notes


def _engines_text(report: dict[str, list[dict[str, Any]]], notes: list[str]) -> str:
    lines: list[str] = []
    for kind, rows in report.items():
        lines.append(f"{kind}:")
        if not rows:
            lines.append("  (none registered)")
        for row in rows:
            mark = "  [selected]" if row["selected"] else ""
            lines.append(
                f"  {row['name']:<8} {row['package']} {row['version']} ({row['license']})"
                f"  {row['entry_point']}{mark}"
            )
            if row["uses"]:
                uses = ", ".join(
                    f"{d['package']} {d['version']} ({d['license']})" for d in row["uses"]
                )
                lines.append(f"           uses: {uses}")
            if row["imports"]:
                lines.append("           imports: ok")
            else:
                lines.append(f"           imports: NO - {row['import_error']}")
            loaded = row.get("loaded")
            if loaded is None:
                continue
            if "error" in loaded:
                lines.append(f"           load: FAILED - {loaded['error']}")
                continue
            model = f", model {loaded['model']}" if loaded["model"] else ""
            lines.append(
                f"           loaded in {loaded['seconds']:.2f} s: {loaded['package']} "
                f"{loaded['version']} ({loaded['license']}){model}"
            )
            if loaded.get("voices"):
                voices = ", ".join(f"{v['id']} ({v['language']})" for v in loaded["voices"])
                lines.append(f"           voices: {voices}")
            if loaded.get("languages"):
                lines.append(f"           languages: {', '.join(loaded['languages'])}")
    for note in notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
