"""What the issue-35 attacks cost a real server, in one run: its RSS peak and a live stream's
lag (WebSocket ping round trips beside 20 ms frames at real-time pace, tests/hostile/watch.py)
during each attack, against the same server quiet (docs/benchmarks.md "Hostile input").

    .venv/bin/python -m scripts.hostile_attacks [--root DIR] [--only NAME ...]

Starts one `voxserve serve` (Wyoming on, one API key, so /v1/stream takes keyed streams and
Wyoming is anonymous) from --root, then for each attack: a quiet window, then the attack
with the live stream beside it. Attacks:
- upload_bombs: 8 uploads that decode to hours at once (two each of FLAC with and without a
  length, Ogg Opus, MP3 without a Xing header; about 1-7 MB each);
- wake_rate: Wyoming `detect` + `audio-start` at rate 1 (and other odd rates), 120 KB of chunks;
- prompt_wedge: two uploads with a repetitive 540-character prompt (it wedged Whisper's
  redo), three plain ones beside them (the official `openai` SDK);
- anonymous_wyoming: 500 anonymous Wyoming connections (`detect` + `audio-start`) held open
  beside 20 keyed WebSocket streams: how many keyed streams were admitted.
A watchdog in the watch ends the run at 3 GB of growth (the old code grew past 6 GB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
from websockets.asyncio.client import connect
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.wake import Detect

from scripts.ready_server import ready_server
from tests.hostile.test_uploads import flac_says, silence
from tests.hostile.watch import Watch, watched
from voxserve.bench.servers import free_port

KEY = "hostile-bench-key"
COMMAND_WAV = (Path(__file__).resolve().parent.parent / "tests/fixtures/command.wav").read_bytes()
PROMPT = ("turn on the kitchen lights " * 21)[:540]


def bombs() -> list[tuple[str, bytes]]:
    """Two each of four bombs made as tests/hostile/test_uploads.py makes them: a 1.8 h FLAC
    whose header says so (1 MB), 2 h of Ogg Opus (1.3 MB), a 2 h FLAC whose header says
    nothing, 2 h of MP3 without a Xing header (7 MB)."""
    made = {
        "flac 1.8 h (header)": flac_says(silence("flac", 6_480), 6_480 * 16_000),
        "ogg opus 2 h (header)": silence("ogg", 7_200),
        "flac 2 h (no length)": flac_says(silence("flac", 7_200), 0),
        "mp3 2 h (no xing)": silence("mp3", 7_200, xing=False),
    }
    return [item for item in made.items() for _ in range(2)]


async def upload_bombs(http: str, wyoming_port: int) -> str:
    made = bombs()

    async def one(client: httpx.AsyncClient, name: str, data: bytes) -> str:
        started = time.monotonic()
        answer = await client.post(
            f"{http}/v1/audio/transcriptions",
            files={"file": ("bomb", data)},
            data={"model": "whisper-1"},
        )
        error = answer.json().get("error", {}).get("code", "") if answer.is_error else ""
        return f"{name} {answer.status_code} {error} {time.monotonic() - started:.2f} s"

    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(timeout=120, headers=headers) as client:
        answers = await asyncio.gather(*(one(client, n, d) for n, d in made))
    return "8 at once: " + "; ".join(answers)


async def wake_rate(http: str, wyoming_port: int) -> str:
    answers = []
    for rate in (1, 7, 100, 7999, 1_000_000):
        client = AsyncTcpClient("127.0.0.1", wyoming_port)
        await client.connect()
        try:
            await client.write_event(Detect().event())
            await client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
            chunk = bytes(12_000)
            for _ in range(10):  # 120 KB
                await client.write_event(
                    AudioChunk(rate=rate, width=2, channels=1, audio=chunk).event()
                )
            event = await asyncio.wait_for(client.read_event(), 10)
            answers.append(
                f"{rate}: {event.type if event else 'closed'}"
                + (f" {event.data.get('code')}" if event and event.data else "")
            )
        except (ConnectionError, TimeoutError) as exc:
            answers.append(f"{rate}: {type(exc).__name__}")
        finally:
            await client.disconnect()
    return "; ".join(answers)


async def prompt_wedge(http: str, wyoming_port: int) -> str:
    """Two uploads with the wedge prompt and, a second later, three plain ones, all with the
    official `openai` SDK: every one answered, the plain ones in their usual time."""
    async with openai.AsyncOpenAI(
        base_url=f"{http}/v1", api_key=KEY, max_retries=0, timeout=180
    ) as sdk:

        async def upload(prompt: str | None) -> str:
            started = time.monotonic()
            extra: dict[str, Any] = {"prompt": prompt} if prompt else {}
            try:
                await sdk.audio.transcriptions.create(
                    model="whisper-1", file=("a.wav", COMMAND_WAV, "audio/wav"), **extra
                )
                status: int | str = 200
            except openai.APIStatusError as exc:
                status = exc.status_code
            except openai.APITimeoutError:
                status = "timeout"
            return f"{status} {time.monotonic() - started:.1f} s"

        wedges = [asyncio.create_task(upload(PROMPT)) for _ in range(2)]
        await asyncio.sleep(1.0)
        plains = await asyncio.gather(*(upload(None) for _ in range(3)))
        wedged = await asyncio.gather(*wedges)
    return f"wedge uploads {wedged}; plain uploads beside them {plains}"


async def anonymous_wyoming(http: str, wyoming_port: int) -> str:
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    refused = 0
    for _ in range(500):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", wyoming_port)
        except OSError:
            refused += 1
            continue
        for event in (Detect().event(), AudioStart(rate=16000, width=2, channels=1).event()):
            header = json.dumps({"type": event.type, "data": event.data}).encode() + b"\n"
            writer.write(header)
        held.append((reader, writer))
    await asyncio.sleep(1.0)
    ws = http.replace("http://", "ws://") + "/v1/stream"
    admitted = 0

    async def keyed() -> bool:
        async with connect(ws, additional_headers={"Authorization": f"Bearer {KEY}"}) as conn:
            await conn.send(json.dumps({"type": "session.start", "mode": "asr"}))
            first = json.loads(await asyncio.wait_for(conn.recv(), 10))
            if first["type"] != "session.started":
                return False
            for seq in range(50):
                await conn.send(seq.to_bytes(4, "big") + bytes(640))
                await asyncio.sleep(0.02)
            return True

    results = await asyncio.gather(*(keyed() for _ in range(20)), return_exceptions=True)
    admitted = sum(r is True for r in results)
    open_after = 0
    for reader, writer in held:
        if await still_open(reader):
            open_after += 1
        writer.close()
    return (
        f"500 anonymous: {refused} refused at connect, {open_after} still open after; "
        f"keyed streams admitted {admitted}/20"
    )


async def still_open(reader: asyncio.StreamReader) -> bool:
    """Whether the server has kept this connection: read what it sent (an error event,
    say) until its end, or until nothing more comes for 10 ms."""
    try:
        while True:
            if not await asyncio.wait_for(reader.read(65536), 0.01):
                return False
    except TimeoutError:
        return True
    except OSError:
        return False


ATTACKS: dict[str, Callable[[str, int], Awaitable[str]]] = {
    "upload_bombs": upload_bombs,
    "wake_rate": wake_rate,
    "prompt_wedge": prompt_wedge,
    "anonymous_wyoming": anonymous_wyoming,
}


def figures(watch: Watch) -> str:
    return (
        f"RSS peak +{watch.rss_growth_mb:.0f} MB | live lag P50 {watch.lag_ms(0.5):.1f} ms"
        f" P99 {watch.lag_ms(0.99):.1f} ms ({len(watch.lags_s)} pings)"
        f" | live transcript {'yes' if watch.transcript().strip() else 'NO'}"
    )


async def run(http: str, pid: int, wyoming_port: int, names: list[str]) -> None:
    for name in names:
        async with watched(http, pid, key=KEY) as quiet:
            await asyncio.sleep(3.0)
        async with watched(http, pid, key=KEY) as attacked:
            outcome = await ATTACKS[name](http, wyoming_port)
        print(f"{name}: {outcome}", flush=True)
        print(f"  quiet:    {figures(quiet)}", flush=True)
        print(f"  attacked: {figures(attacked)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS), default=list(ATTACKS))
    args = parser.parse_args()
    port, wyoming_port = free_port(), free_port()
    cache = tempfile.mkdtemp(prefix="voxserve-hostile-")
    env = dict(
        os.environ,
        PYTHONPATH=args.root,
        XDG_CACHE_HOME=cache,
        VOXSERVE_API_KEYS=KEY,
        VOXSERVE_WYOMING__ZEROCONF="false",
    )
    flags = ("--wyoming-port", str(wyoming_port), "--log-level", "error")
    with ready_server(args.root, port, env, *flags) as server:
        asyncio.run(run(f"http://127.0.0.1:{port}", server.pid, wyoming_port, args.only))


if __name__ == "__main__":
    main()
