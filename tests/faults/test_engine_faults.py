"""Engines that raise, hang past their stage timeout, or die (a BaseException out of the
worker), in ASR and TTS, each with healthy streams alongside: the affected stream gets a
non-fatal error naming the stage and goes on to its next utterance or reply, the healthy
streams finish with the right words, counters add up, resources return to baseline."""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer
from tests.fakes import word_for
from tests.faults.fakes import DIE_HZ, HANG_HZ, RAISE_HZ
from tests.faults.harness import (
    alongside,
    asr_stream,
    back_to_baseline,
    counters_add_up,
    finals,
    resources,
)
from tests.wsclient import collect, of_type

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("poison", "code"),
    [(RAISE_HZ, "engine_error"), (HANG_HZ, "stage_timeout"), (DIE_HZ, "engine_error")],
    ids=["raises", "hangs", "dies"],
)
async def test_asr_fault_hits_one_utterance_of_one_stream(
    fault_server: LiveServer, poison: int, code: str
) -> None:
    baseline = await resources(fault_server)
    events = await alongside(fault_server, asr_stream(fault_server, poison, 900))
    errors = of_type(events, "error")
    assert [(e["code"], e["stage"], e["fatal"]) for e in errors] == [(code, "asr", False)]
    assert finals(events)[-1] == word_for(900)  # the next utterance is recognised
    counters_add_up(of_type(events, "session.ended")[0])
    await back_to_baseline(fault_server, baseline, within_s=5.0)


async def _tts_session(live: LiveServer, *texts: str) -> list[dict[str, Any]]:
    async with connect(live.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        for text in texts:
            await ws.send(json.dumps({"type": "text", "text": text, "flush": True}))
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws, limit_s=30)
    return events


@pytest.mark.parametrize(
    ("word", "code"),
    [("explode", "engine_error"), ("stall", "stage_timeout"), ("die", "engine_error")],
)
async def test_tts_fault_hits_one_reply_of_one_stream(
    fault_server: LiveServer, word: str, code: str
) -> None:
    baseline = await resources(fault_server)
    texts = (f"Please {word} now.", "Then carry on.")
    events = await alongside(fault_server, _tts_session(fault_server, *texts))
    errors = of_type(events, "error")
    assert [(e["code"], e["stage"], e["reply"], e["fatal"]) for e in errors] == [
        (code, "tts", 0, False)
    ]
    ends = of_type(events, "tts.end")
    last = ends[-1]  # the next reply is whole: 3 words of 50 ms
    assert (last["reply"], last["audio_ms"], last["interrupted"]) == (1, 150, False)
    assert of_type(events, "session.ended")
    await back_to_baseline(fault_server, baseline, within_s=5.0)
