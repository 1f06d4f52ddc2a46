"""Whisper tiny.en vs the multilingual base on the same machine, engine alone (no server):
load time and the RSS each load adds, WER on the English fixtures (Piper), the same
sentences spoken by eSpeak NG and the Spanish ones (eSpeak), the language detected, the
final's decode time per utterance (bucketed windows), and what detection costs.

Run from the repository root:
  PYTHONPATH=. .venv/bin/python scripts/bench_whisper_models.py
Prints a markdown table (docs/benchmarks.md, "Whisper models").
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import wave
from pathlib import Path

import ctranslate2
import jiwer
import numpy as np

from voxserve.audio.resample import resample
from voxserve.engines.espeak_tts import EspeakTts
from voxserve.engines.whisper_asr import WhisperAsr
from voxserve.observe.process_memory import rss_bytes

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
REPEATS = 3


def load(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as wav:
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    return (pcm.astype(np.float32) / 32768.0).astype(np.float32)


def norm(text: str) -> str:
    return " ".join("".join(c if c.isalnum() or c.isspace() else " " for c in text.lower()).split())


def corpus(sub: str) -> list[tuple[np.ndarray, str]]:
    texts: dict[str, str] = json.loads((FIXTURES / sub / "fixtures.json").read_text("utf-8"))
    return [(load(FIXTURES / sub / name), text) for name, text in texts.items()]


def espeak_corpus(texts: list[str]) -> list[tuple[np.ndarray, str]]:
    """The English fixtures' sentences spoken by eSpeak NG (espeak-en), at 16 kHz."""
    tts = EspeakTts()
    out = []
    for text in texts:
        pcm = np.concatenate(list(tts.synthesize(text, voice="espeak-en")))
        pcm = resample(pcm, tts.sample_rate, 16_000)
        out.append(((pcm.astype(np.float32) / 32768.0).astype(np.float32), text))
    return out


def run(
    engine: WhisperAsr, items: list[tuple[np.ndarray, str]], language: str | None
) -> dict[str, object]:
    refs, hyps, langs, times = [], [], [], []
    for audio, text in items:
        best = float("inf")
        for _ in range(REPEATS):
            t = time.perf_counter()
            result = engine.transcribe(audio, language=language)
            best = min(best, time.perf_counter() - t)
        refs.append(norm(text))
        hyps.append(norm(result.text))
        langs.append(result.language)
        times.append(best)
    return {
        "wer": round(float(jiwer.wer(refs, hyps)), 3),
        "languages": "".join(f"{lang} " for lang in langs).strip(),
        "median_s": round(statistics.median(times), 3),
    }


def detect_cost(engine: WhisperAsr, audio: np.ndarray) -> tuple[float, float]:
    """(encode s, detect s) for one 10 s window: detection reuses the encoder output."""
    mel = engine._features(audio)[:, :-1]
    padded = np.zeros((1, mel.shape[0], 1000), dtype=np.float32)
    padded[0, :, : mel.shape[1]] = mel[:, :1000]
    enc_t, det_t = [], []
    for _ in range(5):
        t = time.perf_counter()
        encoded = engine._ct2.encode(ctranslate2.StorageView.from_array(padded), to_cpu=False)
        enc_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        engine._ct2.detect_language(encoded)
        det_t.append(time.perf_counter() - t)
    return min(enc_t), min(det_t)


def main() -> None:
    english, spanish = corpus("."), corpus("es")
    robotic = espeak_corpus([text for _, text in english])
    with tempfile.TemporaryDirectory() as cache:
        rss = rss_bytes()
        t = time.perf_counter()
        tiny = WhisperAsr()
        tiny_load, tiny_mb = time.perf_counter() - t, (rss_bytes() - rss) / 1e6
        rss = rss_bytes()
        t = time.perf_counter()
        base = WhisperAsr(model="base", cache_dir=cache)
        base_load, base_mb = time.perf_counter() - t, (rss_bytes() - rss) / 1e6
        t = time.perf_counter()
        base_again = WhisperAsr(model="base", cache_dir=cache)
        reload_s = time.perf_counter() - t
        del base_again
        rows = [
            ("tiny.en", tiny_load, tiny_mb, "English (Piper)", run(tiny, english, None)),
            ("tiny.en", tiny_load, tiny_mb, "English (eSpeak)", run(tiny, robotic, None)),
            ("tiny.en", tiny_load, tiny_mb, "Spanish", run(tiny, spanish, None)),
            ("base", base_load, base_mb, "English (Piper), detected", run(base, english, None)),
            ("base", base_load, base_mb, "English (Piper), given en", run(base, english, "en")),
            ("base", base_load, base_mb, "English (eSpeak), detected", run(base, robotic, None)),
            ("base", base_load, base_mb, "Spanish, detected", run(base, spanish, None)),
            ("base", base_load, base_mb, "Spanish, given es", run(base, spanish, "es")),
        ]
        print("| model | load s | RSS added MB | corpus | WER | languages | median final s |")
        print("|---|---|---|---|---|---|---|")
        for model, load_s, mb, name, r in rows:
            cells = (model, f"{load_s:.2f}", f"{mb:.0f}", name, r["wer"], r["languages"])
            print("| " + " | ".join(str(c) for c in (*cells, r["median_s"])) + " |")
        print(f"\nbase second load (joined file reused): {reload_s:.2f} s")
        enc, det = detect_cost(base, english[2][0])
        print(f"base, 10 s window: encode {enc * 1000:.0f} ms, detect_language {det * 1000:.0f} ms")


if __name__ == "__main__":
    main()
