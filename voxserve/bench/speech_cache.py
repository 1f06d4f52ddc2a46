"""`bench speech-cache`: what a TTS cache hit costs per response format, through the
`openai` SDK (request sent -> whole body read, on one kept-alive connection), and what the
first hit after a restart costs beside a warm one.

Per format, each of `--texts` sentences is asked once cold (a synthesis, or the cached PCM
encoded again), then `--hits` times more, the texts in turn. With `--spawn` the server is
then restarted on the same cache directory and every (format, text) is asked again: its
first answer is a first hit after the restart (the run's very first one also pays what
the server process does on its first speech request), then `--hits` warm ones. Each round
first lists /v1/models, so the client's own first request is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from voxserve.bench.servers import http_base, spawn_voxserve
from voxserve.bench.stats import percentile

FORMATS = ("pcm", "wav", "mp3", "opus", "aac", "flac")
TEXTS = (
    "The quick brown fox jumps over the lazy dog. Then it runs into the forest.",
    "Your package has shipped this afternoon. It should arrive on Friday.",
    "The meeting moved to three o'clock. Please bring the quarterly report.",
    "Thanks for calling our help line. An agent will be with you soon.",
)


def add_speech_cache_parser(add: Any) -> None:
    """`bench speech-cache` (the `add` of bench/cli.py)."""
    parser = add(
        "speech-cache",
        "voxserve.bench.speech_cache:cmd_speech_cache",
        "TTS cache hit cost per response format through the openai SDK, and the first hit "
        "after a restart (--spawn) against a warm one",
    )
    parser.add_argument(
        "--formats",
        type=lambda t: [f for f in t.split(",") if f],
        default=list(FORMATS),
        help="response formats, comma-separated (default %(default)s)",
    )
    parser.add_argument("--hits", type=int, default=20, help="hits per format (default 20)")
    parser.add_argument(
        "--texts", type=int, default=2, help=f"sentences per format, 1..{len(TEXTS)} (default 2)"
    )


def cmd_speech_cache(args: argparse.Namespace) -> int:
    if not 1 <= args.texts <= len(TEXTS):
        raise ValueError(f"--texts must be within 1..{len(TEXTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="voxserve-speech-cache-") as cache_dir:
        env = dict(item.split("=", 1) for item in args.server_env)
        env.setdefault("VOXSERVE_CACHE__DIR", cache_dir)
        with _server(args, out, env) as url:
            warm = _round(url, args, cold=True)
        restart: dict[str, dict[str, list[float]]] = {}
        if args.spawn:
            with _server(args, out, env) as url:
                restart = _round(url, args, cold=False)
    rows = _rows(args.formats, warm, restart)
    (out / "speech-cache.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(_table(rows), flush=True)
    return 0


@contextlib.contextmanager
def _server(args: argparse.Namespace, out: Path, env: dict[str, str]) -> Iterator[str]:
    if not args.spawn:
        yield http_base(args.url)
        return
    with spawn_voxserve(out / "server.log", args.server_config, env) as spawned:
        yield http_base(spawned.url)


def _round(url: str, args: argparse.Namespace, *, cold: bool) -> dict[str, dict[str, list[float]]]:
    """Per format: `first` (each text's first request) and `hits` (the rest), in seconds."""
    import openai

    texts = TEXTS[: args.texts]
    found: dict[str, dict[str, list[float]]] = {}
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with openai.OpenAI(
        base_url=f"{url}/v1", api_key=args.api_key or "none", max_retries=0, timeout=120
    ) as client:
        # The client's own first request (its connection, the SDK's first call) is not the
        # server's: paid here, on a route that touches no speech.
        client.models.list()
        for fmt in args.formats:
            first = [_speak(client, text, fmt, args.voice, headers) for text in texts]
            hits = [
                _speak(client, texts[i % len(texts)], fmt, args.voice, headers)
                for i in range(args.hits)
            ]
            found[fmt] = {"first": first, "hits": hits}
            label = "cold" if cold else "first after restart"
            print(
                f"{fmt}: {label} {_ms(max(first))} ms, hit P50 {_ms(percentile(hits, 50))} ms",
                flush=True,
            )
    return found


def _speak(client: Any, text: str, fmt: str, voice: str | None, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    reply = client.audio.speech.create(
        model="tts-1",
        voice=voice or "alloy",
        input=text,
        response_format=fmt,
        extra_headers=headers,
    )
    if not reply.content:
        raise RuntimeError(f"empty {fmt} reply")
    return time.perf_counter() - started


def _rows(
    formats: list[str],
    warm: dict[str, dict[str, list[float]]],
    restart: dict[str, dict[str, list[float]]],
) -> list[dict[str, Any]]:
    pcm_hit = percentile(warm["pcm"]["hits"], 50) if "pcm" in warm else None
    rows: list[dict[str, Any]] = []
    for fmt in formats:
        hits = warm[fmt]["hits"]
        row: dict[str, Any] = {
            "format": fmt,
            "cold_max_ms": _ms(max(warm[fmt]["first"])),
            "hit_p50_ms": _ms(percentile(hits, 50)),
            "hit_p90_ms": _ms(percentile(hits, 90)),
            "hit_over_pcm_hit": round(percentile(hits, 50) / pcm_hit, 2) if pcm_hit else None,
        }
        if fmt in restart:
            after = restart[fmt]
            first = max(after["first"])
            warm_p50 = percentile(after["hits"], 50)
            row |= {
                "restart_first_max_ms": _ms(first),
                "restart_warm_p50_ms": _ms(warm_p50),
                "restart_first_over_warm": round(first / warm_p50, 2),
            }
        rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0]) if rows else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "-")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)
