"""`voxserve say` and `voxserve transcribe`: one synthesis or one transcription through the
same pipeline functions the server uses, checked before any model loads."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxserve.cli.errors import EXIT_OK, CliError
from voxserve.cli.settings import (
    check_engines_import,
    configure_cli_logging,
    load_cli_settings,
    load_runtime,
)

if TYPE_CHECKING:
    from voxserve.runtime import Runtime


def cmd_say(args: argparse.Namespace) -> int:
    from voxserve.audio.resample import check_rate
    from voxserve.audio.wav import write_wav
    from voxserve.pipeline.synthesis.request import check_speed, check_text
    from voxserve.types import SUPPORTED_OUTPUT_RATES

    settings = load_cli_settings(args)
    configure_cli_logging(args)
    if args.text == "-" and sys.stdin is None:
        raise CliError("text '-' reads standard input, and there is none")
    text = sys.stdin.read() if args.text == "-" else args.text
    # Everything checkable without models is checked before spending seconds loading them.
    text = check_text(text, settings.limits.max_text_chars)
    check_speed(args.speed)
    wanted = settings.tts.output_sample_rate if args.sample_rate is None else args.sample_rate
    rate = check_rate(wanted, SUPPORTED_OUTPUT_RATES)
    output = Path(args.output)
    if not output.parent.is_dir():
        raise CliError(f"{output.parent}: no such directory for the output file")
    if output.is_dir() or not output.name:
        raise CliError(f"{args.output!r} is a directory; -o names the WAV file to write")
    check_engines_import(settings)
    runtime = load_runtime(settings)
    try:
        voice = runtime.engines.voice(args.voice)[0].id
        samples, first_s, total_s = asyncio.run(
            _synthesize(runtime, text, voice=voice, speed=args.speed, sample_rate=rate)
        )
    finally:
        runtime.close()
    if samples.size == 0:
        raise CliError(f"voice {voice!r} produced no audio for this text")
    output.write_bytes(write_wav(samples, rate))
    print(
        f"wrote {output}: {samples.size / rate:.2f} s of audio at {rate} Hz (voice {voice}); "
        f"first chunk after {first_s * 1000:.0f} ms, synthesis took {total_s:.2f} s"
    )
    return EXIT_OK


async def _synthesize(
    runtime: Runtime, text: str, *, voice: str, speed: float, sample_rate: int
) -> tuple[Any, float, float]:
    """synthesize_all, but timing the first chunk (what a streaming client waits for)."""
    import numpy as np

    from voxserve.pipeline.synthesis.synthesize import synthesize

    started = time.perf_counter()
    first: float | None = None
    chunks = []
    async for chunk in synthesize(runtime, text, voice=voice, speed=speed, sample_rate=sample_rate):
        if first is None:
            first = time.perf_counter() - started
        chunks.append(chunk)
    total = time.perf_counter() - started
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    return samples, first if first is not None else total, total


# --- transcribe -----------------------------------------------------------------------------


def cmd_transcribe(args: argparse.Namespace) -> int:
    from voxserve.audio.wav import read_wav
    from voxserve.pipeline.recognition.bulk import transcribe

    settings = load_cli_settings(args)
    configure_cli_logging(args)
    path = Path(args.file)
    if path.is_dir():
        raise CliError(f"{path}: is a directory, not a WAV file")
    samples, rate = read_wav(path.read_bytes())  # before loading models: fail fast
    check_engines_import(settings)
    runtime = load_runtime(settings)
    try:
        result = asyncio.run(transcribe(runtime, samples, rate, language=args.language))
    finally:
        runtime.close()
    if args.format == "json":
        body = {
            "text": result.text.strip(),
            "language": result.language,
            "duration_s": round(samples.size / rate, 3),
            "segments": [
                {
                    "text": seg.text.strip(),
                    "start": round(seg.start_ms / 1000, 3),
                    "end": round(seg.end_ms / 1000, 3),
                }
                for seg in result.segments
            ],
        }
        print(json.dumps(body, ensure_ascii=False))
    else:
        print(result.text.strip())
    return EXIT_OK
