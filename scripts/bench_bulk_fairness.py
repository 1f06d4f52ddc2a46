"""Live final latency with and without two long uploads (issue 28, slot starvation): the
scenario of tests/test_bulk_fairness.py at the issue's size, with longer phases for steadier
percentiles. A real server in this process with the real engines and default settings.

    PYTHONPATH=. .venv/bin/python scripts/bench_bulk_fairness.py [--upload-s 164] \
        [--sessions 3] [--alone-s 20]

Prints, for live finals (vad.end -> transcript.final at the client) alone and beside the
uploads: count, P50, P99, max and errors; then each upload's status and time.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

import tests.test_bulk_fairness as scenario
from tests.conftest import free_port, start_server, stop_server
from tests.helpers import fixture_audio, fixture_texts, wer
from voxserve.config import load_settings


async def measure(upload_s: float, alone_s: float) -> None:
    live = start_server(load_settings(port=free_port(), log_level="warning"))
    try:
        alone = await scenario._live_phase(live, None, alone_s)
        uploads = [scenario._speech(upload_s, rotate) for rotate in (0, 3)]
        async with httpx.AsyncClient(base_url=live.http_url, timeout=600) as client:

            async def run() -> list[tuple[httpx.Response, float]]:
                long = [
                    asyncio.create_task(scenario._upload(client, audio)) for audio, _ in uploads
                ]
                await asyncio.sleep(1.0)
                short = await scenario._upload(client, fixture_audio("command.wav"), "json")
                return [short, *await asyncio.gather(*long)]

            began = time.monotonic()
            work = asyncio.ensure_future(run())
            during = await scenario._live_phase(live, work, 1.0)
            (short, short_s), *replies = work.result()
        for label, record in (("alone", alone), ("with 2 uploads", during)):
            print(
                f"live finals {label}: {len(record.latencies)} finals, "
                f"{scenario._percentiles(record.latencies)}, errors {record.errors}"
            )
        print(f"short upload: {short.status_code} in {short_s:.2f} s")
        for (reply, seconds), (_, expected) in zip(replies, uploads, strict=True):
            score = wer(expected, reply.json()["text"]) if reply.status_code == 200 else None
            print(f"{upload_s:g} s upload: {reply.status_code} in {seconds:.1f} s, WER {score}")
        print(f"uploads phase: {time.monotonic() - began:.1f} s")
    finally:
        stop_server(live)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upload-s", type=float, default=164.0)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--alone-s", type=float, default=20.0)
    args = parser.parse_args()
    scenario.LIVE_SESSIONS = args.sessions
    assert fixture_texts()
    asyncio.run(measure(args.upload_s, args.alone_s))


if __name__ == "__main__":
    main()
