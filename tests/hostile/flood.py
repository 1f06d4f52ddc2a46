"""A flood of HTTP requests sent from a child process, for attacks watched by watch.py.

Sent from the test's own event loop, a flood's client work (httpx building and parsing 60
requests at once: ~100-200 ms of Python) would delay the watcher's pings on the same loop
and under the same GIL, and the live stream's lag would measure the attacker, not the
server. A child process has its own interpreter: the test's loop only waits for its answer.

`python -m tests.hostile.flood` reads one JSON spec on stdin (its `kind`: "http", or
"wyoming-tiny-chunks") and writes the answers as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Answer:
    status_code: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def flood(
    base_url: str, path: str, *, count: int, body: Any, headers: dict[str, str]
) -> list[Answer]:
    """`count` concurrent `POST path` with the JSON `body`, sent by a child process; the
    answers in the order sent."""
    spec = {"base_url": base_url, "path": path, "count": count, "body": body, "headers": headers}
    answers = await _in_child({"kind": "http", **spec})
    return [Answer(a["status"], a["headers"], a["body"].encode("latin-1")) for a in answers]


async def wyoming_tiny_chunks(port: int, chunks: int, rounds: int) -> list[list[str]]:
    """On one Wyoming connection, a wake-word `detect` and `audio-start`, then `rounds` of
    `chunks` one-sample `audio-chunk`s each followed by a ping, then `audio-stop` and a
    ping, sent by a child process with the `wyoming` package: the types of the events that
    came before each pong (rounds + 1 lists)."""
    events: list[list[str]] = await _in_child(
        {"kind": "wyoming-tiny-chunks", "port": port, "chunks": chunks, "rounds": rounds}
    )
    return events


async def _in_child(spec: dict[str, Any]) -> Any:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.hostile.flood",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, _ = await child.communicate(json.dumps(spec).encode())
    assert child.returncode == 0, f"the flood's process exited {child.returncode}"
    return json.loads(out)


async def _send(spec: dict[str, Any]) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=spec["count"])
    async with httpx.AsyncClient(base_url=spec["base_url"], limits=limits, timeout=30) as http:
        answers = await asyncio.gather(
            *(
                http.post(spec["path"], json=spec["body"], headers=spec["headers"])
                for _ in range(spec["count"])
            )
        )
    return [
        {
            "status": a.status_code,
            "headers": dict(a.headers),
            "body": a.content.decode("latin-1"),
        }
        for a in answers
    ]


async def _tiny_chunks(spec: dict[str, Any]) -> list[list[str]]:
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.ping import Ping
    from wyoming.wake import Detect

    audio = {"rate": 16000, "width": 2, "channels": 1}
    seen: list[list[str]] = []
    async with AsyncTcpClient("127.0.0.1", spec["port"]) as wyoming:

        async def until_pong() -> None:
            await wyoming.write_event(Ping(text="alive").event())
            types: list[str] = []
            async with asyncio.timeout(30):
                while (event := await wyoming.read_event()) is not None and event.type != "pong":
                    types.append(event.type)
            seen.append(types if event is not None else [*types, "closed"])

        await wyoming.write_event(Detect(names=["okay_nabu"]).event())
        await wyoming.write_event(AudioStart(**audio).event())
        one = AudioChunk(audio=b"\x01\x00", **audio).event()
        for _ in range(spec["rounds"]):
            for _ in range(spec["chunks"]):
                await wyoming.write_event(one)
            await until_pong()
        await wyoming.write_event(AudioStop().event())
        await until_pong()
    return seen


if __name__ == "__main__":
    request = json.load(sys.stdin)
    run = {"http": _send, "wyoming-tiny-chunks": _tiny_chunks}[request["kind"]]
    sys.stdout.write(json.dumps(asyncio.run(run(request))))
