"""Where each turn detection ends the turns of the bench's fixtures, with ASR taken as
instant (the harness of tests/test_turn_taking.py: a decode started at a pause is back
before more audio comes). Machine-independent: how long each setting waits after the speech
really ended, and how often it ends a turn while the speaker has only paused (premature), the
most eager case (a slower decode only makes turns end later). The bench (`voxserve bench
stream --mode assistant --turn-detection ...`) measures the same on a live server.

    PYTHONPATH=. .venv/bin/python scripts/turn_tradeoff.py [setting ...]

settings: semantic_vad:high semantic_vad:auto ... server_vad:500 (default: all five).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np

from tests.fakes import SR, silence
from tests.helpers import fixture_audio
from tests.test_turn_taking import Turns, of, runtime
from voxserve.bench.program import clip_utterances
from voxserve.engines.whisper_asr import WhisperAsr
from voxserve.events import StreamConfig, TranscriptFinal, TurnDetection, VadEnd
from voxserve.pipeline.turns.endpointing import EndOfTurn

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
SETTINGS = ["semantic_vad:high", "semantic_vad:medium", "semantic_vad:low", "semantic_vad:auto"]


def detection(setting: str) -> TurnDetection:
    kind, _, value = setting.partition(":")
    if kind == "server_vad":
        return TurnDetection(type="server_vad", silence_duration_ms=int(value or 500))
    return TurnDetection(type="semantic_vad", eagerness=value or "auto")  # type: ignore[arg-type]


def clips() -> list[tuple[str, str, np.ndarray]]:
    out = []
    for directory in (FIXTURES, FIXTURES / "turns"):
        texts: dict[str, str] = json.loads((directory / "fixtures.json").read_text())
        for name, text in texts.items():
            out.append((name, text, fixture_audio(str((directory / name).relative_to(FIXTURES)))))
    return out


def spans_of(audio: np.ndarray, text: str) -> list[tuple[int, int]]:
    """(start, end) ms of its utterances as the bench counts them (program.clip_utterances)."""
    padded = np.concatenate([audio, np.zeros(-audio.size % 320, dtype=np.int16)])
    return [(u.first * 20, (u.last + 1) * 20) for u in clip_utterances(padded, text, 0)]


async def measure(asr: WhisperAsr, setting: str) -> dict[str, object]:
    waits: list[int] = []
    premature: set[tuple[str, int]] = set()  # (recording, utterance end): once each
    lead = silence(0.3)
    utterances = 0
    for name, text, audio in clips():
        turns = Turns(runtime(asr), StreamConfig(mode="asr", turn_detection=detection(setting)))
        # utterances as the bench sees them (a pause of 0.6 s or more splits a recording)
        spans = spans_of(np.concatenate([lead, audio]), text)
        utterances += len(spans)
        events = await turns.run(lead, audio, silence(2.5))
        for end, fed in zip(of(events, VadEnd), turns.vad_end_fed, strict=True):
            assert isinstance(end, VadEnd)
            # inside an utterance with speech still to come (VAD's end lags the level's)
            inside = [b for a, b in spans if a <= end.end_ms < b - 150]
            if inside:
                spoken_end = inside[0]
                premature.add((name, spoken_end))
                said = [
                    e.text for e in of(events, TranscriptFinal) if isinstance(e, TranscriptFinal)
                ]
                print(f"  premature: {name} at {end.end_ms} ms: {said}", file=sys.stderr)
            else:
                spoken_end = max((b for _, b in spans if b <= end.end_ms + 150), default=0)
                waits.append(fed * 1000 // SR - spoken_end)
    return {
        "setting": setting,
        "utterances": utterances,
        "premature_turns": len(premature),
        "premature_turn_rate": round(len(premature) / utterances, 3),
        "premature": sorted(name for name, _ in premature),
        "wait_p50_ms": int(np.percentile(waits, 50)),
        "wait_max_ms": int(max(waits)),
    }


async def main(settings: list[str]) -> None:
    asr = WhisperAsr()
    for setting in settings:
        print(json.dumps(await measure(asr, setting)), flush=True)


if __name__ == "__main__":
    EndOfTurn()  # the rules this measures
    asyncio.run(main(sys.argv[1:] or [*SETTINGS, "server_vad:500"]))
