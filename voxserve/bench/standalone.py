"""The same engines the server runs, called directly in this process: what they cost
without the server, for capacity "in the server" vs "standalone" in one run.

Each figure is CPU seconds of this process per second of stream audio (all calls run on
this thread, with the engine's configured threads), and its inverse, the streams one core
could carry if the engine were all there was. ASR replays the pipeline's calls for each
utterance: a partial every chunk_ms once max(min_partial_ms, chunk_ms) of speech are in,
until the hangover ends (an upper bound: under load the server skips partials), then the
final. The utterances are replayed until at least MIN_UTTERANCES finals were decoded, so
the per-utterance figure (the one cross-session batching is judged against: the engine
called one request at a time) is not one program's handful of calls. For Whisper the same
finals also go through faster-whisper's own `transcribe` (`asr_stock`: every buffer in a 30 s
window), the engine as a user calling it directly gets it: what the server's windows and
batching are worth together; for piper, the texts also go through `PiperVoice.load` and
`synthesize` (`tts_stock`: piper's default onnxruntime session).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from voxserve.bench.program import Program, Utterance
from voxserve.bench.stats import summarize
from voxserve.config import Settings
from voxserve.engines.loaded import load_engines
from voxserve.types import FRAME_SAMPLES, SAMPLE_RATE

VAD_BATCH = 1024  # the listener judges two 512-sample windows per call
MIN_UTTERANCES = 21


def _cpu() -> float:
    """CPU time of this process, all threads (ns resolution; os.times() ticks at 10 ms)."""
    return time.process_time()


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float, float]:
    cpu0, wall0 = _cpu(), time.perf_counter()
    out = fn(*args, **kwargs)
    return out, _cpu() - cpu0, time.perf_counter() - wall0


def _per_audio(cpu_s: float, audio_s: float) -> dict[str, float | None]:
    per = cpu_s / audio_s if audio_s else None
    return {
        "audio_s": round(audio_s, 2),
        "cpu_s": round(cpu_s, 3),
        "cpu_s_per_audio_s": round(per, 5) if per else None,
        "streams_per_core": round(1 / per, 1) if per else None,
    }


def _program_audio(program: Program, settings: Settings) -> tuple[np.ndarray, int]:
    """The program as float samples, and the server's pad around an utterance in samples."""
    pcm = np.frombuffer(program.pcm, dtype="<i2").astype(np.float32) / 32768
    return pcm, settings.vad.pad_ms * SAMPLE_RATE // 1000


def _final_cut(pcm: np.ndarray, u: Utterance, pad: int) -> np.ndarray:
    """The audio an utterance's final decodes, as the server cuts it: its frames and pad_ms
    either side (the same cut for every engine measured here)."""
    return pcm[max(0, u.first * FRAME_SAMPLES - pad) : (u.last + 1) * FRAME_SAMPLES + pad]


def _per_utterance(finals: list[float], cpu_s: float) -> dict[str, Any]:
    return {
        "final_decode_ms": summarize(finals),
        "utterances": len(finals),
        "cpu_ms_per_utterance": round(cpu_s / len(finals) * 1000, 1),
        "utterances_per_s_per_core": round(len(finals) / cpu_s, 2) if cpu_s else None,
    }


def measure_vad(engines: Any, audio: np.ndarray) -> dict[str, Any]:
    vad = engines.vad
    state = vad.new_state()
    x = audio[: audio.size // VAD_BATCH * VAD_BATCH].astype(np.float32) / 32768

    def run() -> None:
        for i in range(0, x.size, VAD_BATCH):
            vad.speech_probs(state, x[i : i + VAD_BATCH])

    _, cpu, _ = _timed(run)
    return {"engine": vad.info.name, **_per_audio(cpu, x.size / SAMPLE_RATE)}


def measure_asr(
    engines: Any, program: Program, settings: Settings, chunk_ms: int, partials: bool
) -> dict[str, Any]:
    asr = engines.asr
    pcm, pad = _program_audio(program, settings)
    hang = settings.vad.hangover_ms * SAMPLE_RATE // 1000
    every = chunk_ms * SAMPLE_RATE // 1000
    first_partial = max(settings.asr.min_partial_ms * SAMPLE_RATE // 1000, every)
    cpu_total, finals, partial_calls = 0.0, [], 0
    rounds = -(-MIN_UTTERANCES // len(program.utterances))
    for u in [u for _ in range(rounds) for u in program.utterances]:
        start, end = u.first * FRAME_SAMPLES, (u.last + 1) * FRAME_SAMPLES
        if partials:
            for now in range(start + first_partial, end + hang, every):
                audio = pcm[max(0, start - pad) : now]
                _, cpu, _ = _timed(asr.transcribe, audio, partial=True)
                cpu_total += cpu
                partial_calls += 1
        _, cpu, wall = _timed(asr.transcribe, _final_cut(pcm, u, pad))
        cpu_total += cpu
        finals.append(wall)
    return {
        "engine": asr.info.name,
        "chunk_ms": chunk_ms if partials else None,
        "partial_calls": partial_calls,
        **_per_utterance(finals, cpu_total),
        **_per_audio(cpu_total, rounds * program.frames * FRAME_SAMPLES / SAMPLE_RATE),
    }


def measure_asr_stock(engines: Any, program: Program, settings: Settings) -> dict[str, Any] | None:
    """Finals through faster-whisper's own `transcribe` on the same cuts, one at a time:
    Whisper as shipped (every buffer padded to a 30 s window), greedy like the server, no
    VAD filter. None for an engine that is not Whisper."""
    model = getattr(engines.asr, "whisper_model", None)
    if model is None or not callable(getattr(model, "transcribe", None)):
        return None
    pcm, pad = _program_audio(program, settings)
    cpu_total, finals = 0.0, []
    for u in program.utterances:
        audio = _final_cut(pcm, u, pad)

        def run(audio: np.ndarray = audio) -> str:
            segments, _ = model.transcribe(
                audio,
                language="en",
                beam_size=1,
                vad_filter=False,
                condition_on_previous_text=False,
            )
            return " ".join(seg.text for seg in segments)

        _, cpu, wall = _timed(run)
        cpu_total += cpu
        finals.append(wall)
    return {
        "engine": "faster-whisper transcribe (30 s window)",
        **_per_utterance(finals, cpu_total),
    }


def _timed_synthesis(
    texts: Sequence[str], chunks: Callable[[str], Iterable[int]], sample_rate: int
) -> dict[str, Any]:
    """Each text synthesized alone: time to its first chunk and CPU per second of speech.
    `chunks(text)` runs the synthesis, yielding each chunk's sample count."""
    firsts, cpu_total, samples = [], 0.0, 0
    for text in texts:
        cpu0, wall0 = _cpu(), time.perf_counter()
        for i, size in enumerate(chunks(text)):
            if i == 0:
                firsts.append(time.perf_counter() - wall0)
            samples += size
        cpu_total += _cpu() - cpu0
    audio_s = samples / sample_rate
    return {
        "first_audio_ms": summarize(firsts),
        "speech_s_per_s_per_core": round(audio_s / cpu_total, 2) if cpu_total else None,
        **_per_audio(cpu_total, audio_s),
    }


def measure_tts(engines: Any, texts: Sequence[str]) -> dict[str, Any]:
    voice, engine = engines.voice(None)

    def chunks(text: str) -> Iterator[int]:
        return (chunk.size for chunk in engine.synthesize(text, voice=voice.id))

    return {
        "engine": engine.info.name,
        "voice": voice.id,
        **_timed_synthesis(texts, chunks, engine.sample_rate),
    }


def measure_tts_stock(engines: Any, texts: Sequence[str]) -> dict[str, Any] | None:
    """The same texts through piper's own API as a user calls it: `PiperVoice.load` (its
    default onnxruntime session: a thread per core) and `synthesize`, one text at a time.
    None for a voice that is not piper's."""
    _, engine = engines.voice(None)
    model_path = getattr(engine, "model_path", None)
    if model_path is None:
        return None
    from piper import PiperVoice

    voice = PiperVoice.load(str(model_path), config_path=str(engine.config_path))
    for _ in voice.synthesize(texts[0]):  # espeak-ng and onnxruntime warm up outside
        pass

    def chunks(text: str) -> Iterator[int]:
        return (len(chunk.audio_int16_array) for chunk in voice.synthesize(text))

    return {
        "engine": "piper PiperVoice.load + synthesize (as shipped)",
        **_timed_synthesis(texts, chunks, voice.config.sample_rate),
    }


def measure(
    settings: Settings, program: Program | None, texts: Sequence[str], chunk_ms: int, partials: bool
) -> dict[str, Any]:
    """Load the engines of `settings` here and measure each on the same audio and texts."""
    engines = load_engines(settings)
    try:
        out: dict[str, Any] = {"threads_per_engine": settings.engines.default_threads}
        if program is not None:
            pcm = np.frombuffer(program.pcm, dtype="<i2")
            out["vad"] = measure_vad(engines, pcm)
            if program.utterances:
                out["asr"] = asr = measure_asr(engines, program, settings, chunk_ms, partials)
                # What the server's ASR path runs per utterance: VAD over its audio + ASR.
                vad_ms = out["vad"]["cpu_s"] * 1000 / len(program.utterances)
                out["asr_with_vad_cpu_ms_per_utterance"] = round(
                    asr["cpu_ms_per_utterance"] + vad_ms, 1
                )
                stock = measure_asr_stock(engines, program, settings)
                if stock is not None:
                    out["asr_stock"] = stock
        out["tts"] = measure_tts(engines, texts)
        stock_tts = measure_tts_stock(engines, texts)
        if stock_tts is not None:
            out["tts_stock"] = stock_tts
        return out
    finally:
        engines.close()
