"""What a run measures against: the server (given by URL, or spawned) and the audio it plays.

Only the host in --url (or the loopback server the tool spawns) is ever contacted.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from voxserve.bench import program as prog
from voxserve.bench.procstat import pid_listening_on
from voxserve.bench.servers import http_base, port_of, spawn_voxserve, ws_url

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")

# Sentences for closed-loop quality with --source tts, and the tts modes' texts.
SENTENCES = (
    "What time is it?",
    "Please turn on the lights in the kitchen.",
    "The weather today is sunny with a light breeze.",
    "Can you remind me to call my mother tomorrow morning?",
    "The train to Boston leaves at nine from platform four.",
    "I would like a table for two near the window.",
    "Thank you, that was very helpful.",
    "How long does it take to drive to the airport?",
)


@dataclass(frozen=True)
class Target:
    url: str  # ws://HOST:PORT/v1/stream
    pid: int | None  # the server process, when it can be sampled

    @property
    def http(self) -> str:
        return http_base(self.url)


@contextlib.contextmanager
def target(args: argparse.Namespace, out: Path) -> Iterator[Target]:
    """--spawn: a server of our own (config + env), stopped at the end; else --url, with
    the pid from --server-pid or found by port when the host is this machine."""
    if args.spawn:
        env = {**reply_cache_env(args), **dict(item.split("=", 1) for item in args.server_env)}
        with spawn_voxserve(out / "server.log", args.server_config, env) as spawned:
            yield Target(spawned.url, spawned.pid)
        return
    url = ws_url(args.url)
    pid = args.server_pid
    host = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
    if pid is None and host in LOOPBACK:
        pid = pid_listening_on(port_of(url))
    if pid is None:
        print("bench: server process not found; server CPU/RSS are not reported", file=sys.stderr)
    yield Target(url, pid)


REPLY_MODES = ("assistant", "realtime", "webrtc")


def reply_cache_env(args: argparse.Namespace) -> dict[str, str]:
    """`--reply-cache off`: the spawned server's TTS cache off where the bench's replies
    are timed. The bench's replies repeat ("I heard: ..." for the same recordings), so with
    the cache on a turn after the first cycle skips its synthesis (~150 ms), which a new
    sentence does not: the turn figure would be the decision's, not the first audio's."""
    replies = getattr(args, "mode", None) in REPLY_MODES or hasattr(args, "transports")
    if replies and getattr(args, "reply_cache", "on") == "off":
        return {"VOXSERVE_CACHE__ENABLED": "false"}
    return {}


def speech_from_server(
    base: str, texts: tuple[str, ...], voice: str | None
) -> list[tuple[prog.Pcm, str]]:
    """Closed loop: the server's own TTS says sentences we know, to be recognised back."""
    clips = []
    with httpx.Client(timeout=120) as client:
        for text in texts:
            body = {"model": "tts-1", "input": text, "response_format": "pcm", "sample_rate": 16000}
            if voice:
                body["voice"] = voice
            resp = client.post(f"{base}/v1/audio/speech", json=body)
            resp.raise_for_status()
            pcm = np.frombuffer(resp.content[: len(resp.content) // 2 * 2], dtype="<i2")
            lead = np.zeros(4000, dtype=np.int16)  # 250 ms, as the fixtures have
            clips.append((np.concatenate([lead, pcm, lead]), text))
    return clips


def audio_program(args: argparse.Namespace, tgt: Target) -> prog.Program:
    """The looped audio every stream plays (--source fixtures | tts | silence)."""
    turns = args.mode in ("assistant", "realtime", "webrtc")
    gap = args.gap if args.gap is not None else (3.0 if turns else 1.0)
    if args.source == "silence":
        return prog.build([(prog.noise_clip(10.0), "")], 0.0)
    if args.source == "tts":
        return prog.build(speech_from_server(tgt.http, SENTENCES, args.voice), gap)
    dirs = args.audio_dir or ("tests/fixtures,tests/fixtures/turns" if turns else "tests/fixtures")
    clips = [clip for d in dirs.split(",") for clip in prog.fixture_clips(Path(d.strip()))]
    return prog.build(clips, gap)
