"""What one piper model call costs by its length, and what a hostile text costs the engine:
the figures behind MAX_PHONEME_IDS (voxserve/engines/piper_tts.py, docs/reliability.md).

    .venv/bin/python -m scripts.piper_call_memory [--ids 64,128,160,256,400] [--text-s 60]

1. For each id count, in a fresh process (onnxruntime's arena keeps what it grew to): the
   growth of the resident set (peak, VmHWM) over one model call after a short warm-up call,
   the call's time and the seconds of audio it made. The phonemes are those of spoken
   numbers, the text that made piper grow without bound.
2. In a fresh process: PiperTts.synthesize on 3,500 characters of digits and commas (the
   request that took a server down), pulled for at most --text-s seconds: chunks, audio,
   peak RSS growth. A watchdog ends the run at 3 GB of growth.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

DIGITS_TEXT = ",".join(["1,234,567,890"] * 270)[:3500]
WATCHDOG_BYTES = 3_000_000_000


def status_bytes(key: str) -> int:
    """A VmRSS / VmHWM line of /proc/self/status, in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def one_call(ids: int) -> str:
    from piper import SynthesisConfig

    from voxserve.engines.piper_tts import PiperTts

    voice = PiperTts()._voice
    syn = SynthesisConfig(length_scale=voice.config.length_scale, normalize_audio=False)
    words = "one billion two hundred thirty four million five hundred sixty seven thousand "
    phonemes = [p for sentence in voice.phonemize(words * 40) for p in sentence]
    voice.phoneme_ids_to_audio(voice.phonemes_to_ids(phonemes[:20]), syn)
    base = status_bytes("VmHWM")
    chosen = voice.phonemes_to_ids(phonemes)[:ids]
    started = time.perf_counter()
    audio = voice.phoneme_ids_to_audio(chosen, syn)
    took = time.perf_counter() - started
    grown = (status_bytes("VmHWM") - base) / 1e6
    seconds = len(audio) / voice.config.sample_rate
    return f"| {len(chosen)} | {seconds:.1f} | {took:.2f} | {grown:.0f} |"


def hostile_text(limit_s: float) -> str:
    from voxserve.engines.piper_tts import PiperTts

    engine = PiperTts()
    base = status_bytes("VmRSS")
    peak = [base]

    def watch() -> None:
        while True:
            rss = status_bytes("VmRSS")
            peak[0] = max(peak[0], rss)
            if rss - base > WATCHDOG_BYTES:
                print(f"| stopped by the watchdog at {(rss - base) / 1e6:.0f} MB |", flush=True)
                os._exit(1)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    started = time.perf_counter()
    chunks = samples = 0
    first_s = 0.0
    for chunk in engine.synthesize(DIGITS_TEXT, voice="joe"):
        chunks += 1
        samples += chunk.size
        first_s = first_s or time.perf_counter() - started
        if time.perf_counter() - started > limit_s:
            break
    took = time.perf_counter() - started
    audio_s = samples / engine.sample_rate
    grown = (max(peak[0], status_bytes("VmRSS")) - base) / 1e6
    return (
        f"| {len(DIGITS_TEXT)} | {chunks} | {first_s:.2f} | {audio_s:.0f} | {took:.0f} "
        f"| {grown:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids", default="64,128,160,256,400")
    parser.add_argument("--text-s", type=float, default=60.0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "text":
        print(hostile_text(args.text_s), flush=True)
        return
    if args.child:
        print(one_call(int(args.child)), flush=True)
        return
    me = [sys.executable, "-m", "scripts.piper_call_memory"]
    print("| phoneme ids | audio s | call s | peak RSS growth MB |\n|---|---|---|---|")
    for ids in args.ids.split(","):
        subprocess.run([*me, "--child", ids], check=False)
    print(
        "\n| digits text chars | chunks | first chunk s | audio s | pulled s "
        "| peak RSS growth MB |\n|---|---|---|---|---|---|"
    )
    subprocess.run([*me, "--child", "text", "--text-s", str(args.text_s)], check=False)


if __name__ == "__main__":
    main()
