"""Mandarin intelligibility, closed loop: TTS -> multilingual Whisper base, per sentence.

Prints, for each sentence, the language Whisper detects (and its probability), what it
heard and the character error rate (Han characters only, simplified prompt), then the
mean CER and the voice's real-time factor (synthesis time / audio time, one thread).
`--espeak [NAME]` measures eSpeak NG's `cmn` voice (or a variant, `cmn+f2`) the same way:
the reason it is not offered.

    PYTHONPATH=. .venv/bin/python scripts/zh_closed_loop.py [--espeak [cmn+f2]]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jiwer
import numpy as np
import soxr

from tests.engines.test_mandarin import PROMPT, han, multilingual_base
from voxserve.types import SAMPLE_RATE

SENTENCES = (
    "今天天气很好，我们去公园散步吧。",
    "我想喝一杯热咖啡。",
    "这本书非常有意思。",
    "火车站离这里不远。",
    "请把窗户打开一下。",
    "明天上午九点我们在学校门口见面。",
    "他每天早上六点起床跑步。",
    "这家饭馆的菜又便宜又好吃。",
)


def baker() -> tuple[Callable[[str], np.ndarray], int]:
    from voxserve.engines.baker_tts import VOICE_ID, BakerTts

    tts = BakerTts()
    return lambda text: np.concatenate(list(tts.synthesize(text, voice=VOICE_ID))), tts.sample_rate


def espeak_cmn(name: str) -> tuple[Callable[[str], np.ndarray], int]:
    from voxserve.engines.espeak_tts import RATE_NORMAL, _Library

    lib = _Library.get()

    def synth(text: str) -> np.ndarray:
        with _Library.lock:
            return lib.synth(text, name, RATE_NORMAL)

    return synth, lib.sample_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--espeak", nargs="?", const="cmn", help="an eSpeak NG voice (cmn, cmn+f2), not zh-baker"
    )
    args = parser.parse_args()
    synth, rate = espeak_cmn(args.espeak) if args.espeak else baker()
    with tempfile.TemporaryDirectory() as folder:
        whisper = multilingual_base(Path(folder))
        cers, made_s, audio_s = [], 0.0, 0.0
        for text in SENTENCES:
            start = time.perf_counter()
            audio = synth(text)
            made_s += time.perf_counter() - start
            audio_s += audio.size / rate
            pcm = soxr.resample(audio.astype(np.float32) / 32768.0, rate, SAMPLE_RATE)
            segments, info = whisper.transcribe(pcm, beam_size=5, initial_prompt=PROMPT)
            heard = "".join(s.text for s in segments)
            cer = jiwer.cer(han(text), han(heard) or "-")
            cers.append(cer)
            print(f"{info.language} {info.language_probability:.3f} CER {cer:.2f} {heard}")
    print(f"mean CER {np.mean(cers):.3f}; RTF {made_s / audio_s:.3f} ({audio_s:.1f} s of audio)")


if __name__ == "__main__":
    main()
