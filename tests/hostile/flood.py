"""A flood of HTTP requests sent from a child process, for attacks watched by watch.py.

Sent from the test's own event loop, a flood's client work (httpx building and parsing 60
requests at once: ~100-200 ms of Python) would delay the watcher's pings on the same loop
and under the same GIL, and the live stream's lag would measure the attacker, not the
server. A child process has its own interpreter: the test's loop only waits for its answer.

`python -m tests.hostile.flood` reads one JSON spec on stdin and writes the answers as JSON.
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
    return [Answer(a["status"], a["headers"], a["body"].encode("latin-1")) for a in json.loads(out)]


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


if __name__ == "__main__":
    sys.stdout.write(json.dumps(asyncio.run(_send(json.load(sys.stdin)))))
