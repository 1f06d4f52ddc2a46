"""The argparse tree: every command, flag and help text of `voxserve`."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from voxserve import __version__
from voxserve.cli.argtypes import Handler, Subparsers, port_number, positive_int
from voxserve.cli.cache import add_cache_parser
from voxserve.cli.cluster import add_cluster_parser
from voxserve.cli.engines import add_engines_arguments, cmd_engines_action
from voxserve.cli.errors import PROG
from voxserve.cli.models import add_models_parser
from voxserve.cli.serve import cmd_serve
from voxserve.cli.speech import cmd_say, cmd_transcribe
from voxserve.cli.stats import add_stats_parser


def build_parser(add_bench: Callable[[Subparsers], None]) -> argparse.ArgumentParser:
    """The whole command line; `add_bench` adds the bench command (see `voxserve.cli.bench`)."""
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

    def command(
        name: str, handler: Handler, help_text: str, description: str
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help_text, description=description)
        sub.set_defaults(handler=handler)
        return sub

    serve = command(
        "serve",
        cmd_serve,
        "run the server (WebSocket /v1/stream, OpenAI-compatible HTTP, gRPC, Wyoming)",
        "Run the server. Models load in the background; /healthz answers at "
        "once and /readyz turns 200 when every engine is loaded.",
    )
    serve.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 8000; 0 picks a free one)")
    serve.add_argument(
        "--grpc-port",
        type=port_number,
        metavar="PORT",
        help="gRPC (voxserve.v1) port (default 50051; 0 disables gRPC)",
    )
    serve.add_argument(
        "--wyoming-port",
        type=port_number,
        metavar="PORT",
        help="Wyoming (Home Assistant) port (default 10300; 0 disables Wyoming)",
    )
    serve.add_argument(
        "--no-zeroconf",
        action="store_true",
        default=None,
        help="do not advertise the Wyoming port over zeroconf (Home Assistant discovery)",
    )
    serve.add_argument(
        "--zeroconf-name",
        metavar="NAME",
        help="zeroconf instance name of the Wyoming port (default voxserve-<host name>)",
    )
    serve.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="PEM certificate: serve HTTPS/WSS and gRPC over TLS (needs --tls-key)",
    )
    serve.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    serve.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="API key clients must send (Authorization: Bearer KEY); repeatable, plain or "
        "sha256:<hex>; adds to api_keys of the config and VOXSERVE_API_KEYS (comma-separated)",
    )
    serve.add_argument(
        "--api-keys-file",
        metavar="FILE",
        help="file of API keys, one a line (plain or sha256:<hex>; # comments)",
    )
    serve.add_argument(
        "--admin-key", metavar="KEY", help="bearer key of the /admin routes (VOXSERVE_ADMIN_KEY)"
    )
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        default=None,
        help="allow serving without API keys on a non-loopback --host",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="browser origin (scheme://host[:port]) allowed to use the HTTP API and the "
        "WebSocket; repeatable (default: none but the server's own page)",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="Host name requests may carry besides loopback and --host (DNS-rebinding "
        "defence): the public name behind a proxy, *.example.com, or * for any; repeatable "
        "or comma-separated (allowed_hosts)",
    )
    serve.add_argument(
        "--max-sessions",
        type=positive_int,
        metavar="N",
        help="live sessions (WebSocket, gRPC streams, Wyoming) this process admits; more are "
        "refused at once with a retry hint (default 500; limits.max_sessions)",
    )
    serve.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where the persistent TTS cache lives (default $XDG_CACHE_HOME/voxserve, "
        "else ~/.cache/voxserve)",
    )
    serve.add_argument(
        "--offline",
        action="store_true",
        default=None,
        help="never reach the Hugging Face Hub: models named must be downloaded already "
        "(`voxserve models pull NAME`); offline, VOXSERVE_OFFLINE=1, HF_HUB_OFFLINE=1",
    )
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
    serve.add_argument(
        "--log-module",
        action="append",
        metavar="LOGGER=LEVEL",
        help="log level of one logger and its children, e.g. voxserve.pipeline=debug "
        "(repeatable; adds to log_modules of the config)",
    )
    serve.add_argument(
        "--cluster",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="send ASR and TTS to the Ray Serve core tier (`voxserve cluster up`) at ADDRESS "
        "(default: cluster.address of the config, 'auto'); needs the cluster extra",
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker processes sharing the port (default 1); engines that start no threads "
        "are loaded once before fork and shared",
    )
    serve.add_argument(
        "--tracemalloc",
        type=int,
        metavar="FRAMES",
        help="trace allocations (FRAMES per trace) for GET /debug/tracemalloc; slows the server",
    )
    serve.add_argument(
        "--otel",
        action="store_true",
        default=None,
        help="OpenTelemetry spans per turn (needs the otel extra; exporter from OTEL_* env)",
    )

    say = command(
        "say",
        cmd_say,
        "synthesise text to a WAV file",
        "Synthesise TEXT with the configured TTS engines and write a WAV file.",
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

    transcribe = command(
        "transcribe",
        cmd_transcribe,
        "transcribe a WAV file",
        "Transcribe a 16-bit PCM WAV file with the configured ASR engine.",
    )
    transcribe.add_argument("file", metavar="FILE", help="WAV file (16-bit PCM, any rate)")
    transcribe.add_argument("--language", help="language code (default: the engine decides)")
    transcribe.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help="plain text (default) or JSON with segments",
    )

    engines = command(
        "engines",
        cmd_engines_action,
        "list the registered engines (versions, licences); 'reload' hot-reloads a server's",
        "List every registered engine per kind with its package, version and "
        "licence, and which ones the config selects. Without --load no model is loaded. "
        "'voxserve engines reload' loads new engines into a running server while streams "
        "go on (admin key).",
    )
    engines.add_argument(
        "--load", action="store_true", help="load each engine; report load time, model, voices"
    )
    engines.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_engines_arguments(engines)  # `voxserve engines reload`: hot reload of a server

    add_cache_parser(commands, common)
    add_models_parser(commands, common)
    add_cluster_parser(commands, common)
    add_stats_parser(commands, common)
    add_bench(commands)
    return parser
