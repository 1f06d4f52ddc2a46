"""The prompt wedge (issue 35, finding 4): two uploads with a repetitive 540-character
`prompt` and, a second later, three plain uploads, all at once with the official `openai`
SDK against an in-process server on the default engines, beside a live `/v1/stream` session
watched by tests/hostile/watch.py (docs/reliability.md "Engines").

    PYTHONPATH=. .venv/bin/python scripts/hostile_prompt_wedge.py

Reports each upload's status and seconds, the RSS at the start and its peak, and the live
stream's ping lag (P50, P99). For "before", run it with PYTHONPATH set to an older checkout
(from that checkout's root): its voxserve and tests/ are the ones imported. The process
ends with os._exit, so a wedged engine thread cannot keep it alive.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import openai

from tests.audio_files import encode
from tests.conftest import free_port, start_server
from tests.helpers import fixture_audio
from tests.hostile.watch import watched
from voxserve.config import load_settings

WEDGE = ("turn on the kitchen lights " * 21)[:540]


async def main() -> None:
    live = start_server(load_settings(port=free_port(), log_level="error"))
    wav = encode(fixture_audio("command.wav"), "wav")
    plain = encode(fixture_audio("lights.wav"), "wav")
    base_url = live.http_url + "/v1"
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=60) as sdk:

        async def upload(prompt: str | None, data: bytes) -> tuple[int | str, float]:
            started = time.monotonic()
            extra: dict[str, Any] = {"prompt": prompt} if prompt else {}
            try:
                await sdk.audio.transcriptions.create(
                    model="whisper-1", file=("a.wav", data, "audio/wav"), **extra
                )
                status: int | str = 200
            except openai.APIStatusError as exc:
                status = exc.status_code
            except openai.APITimeoutError:
                status = "timeout"
            return status, round(time.monotonic() - started, 1)

        async with watched(live.http_url) as watch:
            wedges = [asyncio.create_task(upload(WEDGE, wav)) for _ in range(2)]
            await asyncio.sleep(1.0)
            plains = await asyncio.gather(*(upload(None, plain) for _ in range(3)))
            wedged = await asyncio.gather(*wedges)
    print(f"wedge uploads {wedged}; plain uploads beside them {plains}")
    print(
        f"RSS start {watch.rss_start / 1e6:.0f} MB, peak {watch.rss_peak / 1e6:.0f} MB "
        f"(+{watch.rss_growth_mb:.0f}); live ping lag P50 {watch.lag_ms(0.5):.0f} ms, "
        f"P99 {watch.lag_ms(0.99):.0f} ms ({len(watch.lags_s)} pings)"
    )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    asyncio.run(main())
