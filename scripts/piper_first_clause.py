"""Engine time of a first clause: piper joe-medium, one thread, the first chunk of each of
`voxserve bench tts-burst`'s texts, alone and two at once (the TTS stage's two slots). What
`tts.degrade.one_shot_first_audio_budget_ms` is sized from (docs/benchmarks.md): a burst of
N requests has its last first clause after N x the two-at-once throughput.

    flock /work/wt/notes/bench.lock python scripts/piper_first_clause.py
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from voxserve.bench.stats import percentile
from voxserve.bench.tts_burst import TEXTS
from voxserve.engines.piper_tts import PiperTts

REPEATS = 3


def main() -> None:
    engine = PiperTts()

    def first(text: str) -> tuple[float, float]:
        began = time.perf_counter()
        chunk = next(engine.synthesize(text, voice="joe"))  # the rest is never made
        spent = time.perf_counter() - began
        return spent, chunk.size / engine.sample_rate

    first(TEXTS[0])  # set-up calls, not measured
    first(TEXTS[1])
    texts = [text for _ in range(REPEATS) for text in TEXTS]
    alone = [first(text) for text in texts]
    with ThreadPoolExecutor(2) as pool:
        began = time.perf_counter()
        both = list(pool.map(first, texts))
        wall = time.perf_counter() - began
    one = [s for s, _ in alone]
    two = [s for s, _ in both]
    audio = [a for _, a in alone]
    print(
        f"alone: first clause P50 {percentile(one, 50):.3f} s, P90 {percentile(one, 90):.3f} s;"
        f" its audio mean {sum(audio) / len(audio):.2f} s, min {min(audio):.2f} s"
    )
    print(
        f"two at once: per call P50 {percentile(two, 50):.3f} s, P90 {percentile(two, 90):.3f} s;"
        f" {len(two)} first clauses in {wall:.2f} s = {wall / len(two) * 1000:.0f} ms each"
    )


if __name__ == "__main__":
    main()
