"""POST /v1/audio/speech: OpenAI's speech request, validated in full, then audio streamed
as it is synthesised and encoded (mp3, opus, aac, flac, wav, pcm; raw or as SSE:
server/http/speech_output.py). A reply in a compressed format whose encoding the TTS cache
holds is answered from it at once (pipeline/synthesis/encodings.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from voxserve.config import Settings
from voxserve.engines.loaded import Engines
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.pipeline.context import SpeechContext
from voxserve.pipeline.generations import Lease
from voxserve.pipeline.synthesis.encodings import Encodings
from voxserve.pipeline.synthesis.request import check_speed, check_text
from voxserve.pipeline.synthesis.synthesize import first_audio, synthesize
from voxserve.runtime import Chosen, Runtime
from voxserve.server.http.closing_stream import ClosingStream
from voxserve.server.http.speech_output import OutputPlan, cached_body, output_plan, speech_body
from voxserve.server.session import openai_voices
from voxserve.server.session.auth import ANONYMOUS, cache_scope
from voxserve.server.session.http_requests import read_json
from voxserve.server.session.json_input import as_float, optional_str
from voxserve.types import Voice

RATE_HEADER = "X-Voxserve-Sample-Rate"


@dataclass(frozen=True, slots=True)
class SpeechPlan:
    """A fully validated speech request."""

    text: str
    voice: Voice
    speed: float
    output: OutputPlan


async def speech(runtime: Runtime, request: Request, trace_id: str) -> Response:
    limits = runtime.settings.limits
    body = await read_json(request, limits.max_message_bytes, limits.max_json_depth)
    model = optional_str(body.get("model"), "model")
    # A named TTS model ([models]) is loaded now and held until the body ends; OpenAI's
    # names, none, or a default engine's name are the default engines, as before.
    held: Lease | None = None
    ctx: SpeechContext = runtime
    if model not in {engine.info.name for engine in runtime.engines.tts}:
        entry = runtime.models.entry("tts", model)
        if not entry.default:
            held = await runtime.models.lease(tts=entry.name)
            ctx = Chosen(runtime, held)
    try:
        plan = _speech_plan(body, ctx.engines, runtime.settings, model)
        principal = getattr(request.state, "principal", ANONYMOUS)
        scope = cache_scope(runtime.settings, principal)
        out = plan.output
        headers = {
            RATE_HEADER: str(out.sample_rate),
            "X-Voxserve-Voice": plan.voice.id,
            "Cache-Control": "no-store",
        }
        encodings = Encodings.of(
            ctx,
            plan.text,
            voice=plan.voice.id,
            speed=plan.speed,
            sample_rate=out.sample_rate,
            response_format=out.response_format,
            scope=scope,
        )
        hit = encodings.cached() if encodings is not None else None
        if hit is not None:
            if held is not None:
                held.release()
            body_bytes = cached_body(out, hit.data, hit.samples, plan.text)
            return Response(body_bytes, media_type=out.media_type, headers=headers)
        chunks = synthesize(
            ctx,
            plan.text,
            voice=plan.voice.id,
            speed=plan.speed,
            sample_rate=out.sample_rate,
            scope=scope,
            # a one-shot request: behind live sessions' replies (pipeline/scheduling/stage.py)
            bulk=True,
        )
        # Waiting for the first chunk before answering keeps a failing engine (or a text the
        # voice says nothing for) a JSON error, and the answer starts with real audio
        # (time-to-first-audio = the engine's, plus the codec's look-ahead: audio/encode.py).
        first = await first_audio(chunks)
    except BaseException:
        if held is not None:
            held.release()
        raise
    return ClosingStream(
        speech_body(out, chunks, first, plan.text, trace_id, runtime.pools.encode, encodings),
        media_type=out.media_type,
        headers=headers,
        sources=(chunks, held),  # also when the body never started; a lease ends with it
    )


def _speech_plan(
    body: dict[str, Any], engines: Engines, settings: Settings, model: str | None
) -> SpeechPlan:
    text = body.get("input")
    if not isinstance(text, str):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "input must be a string: the text to speak")
    text = check_text(text, settings.limits.max_text_chars)
    named = openai_voices.requested(engines, body.get("voice"), settings.tts.openai_voices)
    voice = _speech_voice(engines, model, named)
    output = output_plan(body, settings.tts.output_sample_rate)
    speed = check_speed(_number(body.get("speed", 1.0), "speed"))
    # `instructions` (style prompts for gpt-4o-mini-tts) is accepted and ignored: the
    # engines have no style control (docs/protocol.md). Only its type is checked.
    optional_str(body.get("instructions"), "instructions")
    return SpeechPlan(text, voice, speed, output)


def _speech_voice(engines: Engines, model: str | None, voice_id: str | None) -> Voice:
    """A default engine's name ("piper", "espeak") restricts the voice to that engine and
    picks its first voice by default; otherwise `engines` are the model's (the default
    engines, or a named model's: its voices only)."""
    by_name = {engine.info.name: engine for engine in engines.tts}
    engine = by_name.get(model or "")
    if engine is None:
        return engines.voice(voice_id)[0]
    own = engine.voices()
    if voice_id is None and own:
        return own[0]
    if voice_id is not None:
        voice, owner = engines.voice(voice_id)
        if owner is engine:
            return voice
    valid = ", ".join(v.id for v in own) or "none"
    raise VoxError(
        ErrorCode.UNKNOWN_VOICE,
        f"voice {quoted(voice_id)} is not a {model} voice; valid voices: {valid}",
    )


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"{name} must be a number")
    return as_float(value, name)
