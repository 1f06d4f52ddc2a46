"""`session.update` (GA or beta names) and beta's `transcription_session.update`, merged into
the settings in force: a field left out keeps its value, a null turns a feature off
(turn_detection: push-to-talk; transcription: no transcription events). Every value is
checked here, with a code (docs/realtime.md); what voxserve accepts but does not use is
listed in IGNORED and documented. Pure (server/realtime_api/codec.py calls it)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.events import EAGERNESS, TURN_TYPES, Eagerness, ToolSpec, TurnDetection
from voxserve.server.realtime_api.session import (
    BETA_FORMATS,
    FORMAT_RATES,
    TOOL_CHOICES,
    Format,
    Modality,
    RealtimeSettings,
    Transcription,
)
from voxserve.server.session import fields as f
from voxserve.server.session.fields import SILENCE_MS

Obj = dict[str, Any]
MAX_TOOLS = 128
MAX_TOKENS = 4096  # OpenAI's range for max_output_tokens
SPEED = (0.25, 1.5)  # OpenAI's range for audio.output.speed
MAX_PADDING_MS = 10_000
MAX_TEXT = 64 * 1024  # instructions, a tool's description, a prompt

IGNORED = {
    # GA: accepted and not used (docs/realtime.md says why for each)
    "id",
    "object",
    "expires_at",
    "include",
    "tracing",
    "truncation",
    "prompt",
    "reasoning",
    "parallel_tool_calls",
    # beta
    "temperature",
    "client_secret",
    "input_audio_noise_reduction",
}
GA_KEYS = {
    "type",
    "model",
    "instructions",
    "audio",
    "output_modalities",
    "tools",
    "tool_choice",
    "max_output_tokens",
}
BETA_KEYS = {
    "model",
    "instructions",
    "input_audio_format",
    "output_audio_format",
    "voice",
    "speed",
    "turn_detection",
    "input_audio_transcription",
    "modalities",
    "tools",
    "tool_choice",
    "max_response_output_tokens",
}
BETA_ONLY = BETA_KEYS - GA_KEYS


def speaks_beta(session: Obj) -> bool:
    """A session.update in beta's names (any name only beta has)."""
    return any(key in session for key in BETA_ONLY)


def _check_keys(data: Obj, known: set[str], path: str) -> None:
    for key in data:
        if key not in known and key not in IGNORED:
            raise f.bad_value(f"{path}: {quoted(key)}", "is not a parameter voxserve knows")


def update_ga(s: RealtimeSettings, session: Obj) -> RealtimeSettings:
    path = "session"
    _check_keys(session, GA_KEYS, path)
    kind = f.choice(session, "type", path, ("realtime", "transcription"))
    if kind is not None and kind != s.kind:
        raise f.bad_value(f"{path}.type", f"cannot change from {s.kind!r} to {kind!r}")
    s = _common(s, session, path)
    modalities = f.listed(session, "output_modalities", path)
    if modalities is not None:
        s = dataclasses.replace(s, output_modalities=modalities_of(modalities, path, beta=False))
    tokens = max_tokens(session.get("max_output_tokens"), f"{path}.max_output_tokens")
    if "max_output_tokens" in session:
        s = dataclasses.replace(s, max_output_tokens=tokens)
    audio = f.obj(session, "audio", path)
    if audio is None:
        return s
    _check_keys(audio, {"input", "output"}, f"{path}.audio")
    audio_in = f.obj(audio, "input", f"{path}.audio")
    if audio_in is not None:
        p = f"{path}.audio.input"
        _check_keys(audio_in, {"format", "transcription", "turn_detection", "noise_reduction"}, p)
        if "format" in audio_in:
            s = dataclasses.replace(s, input_format=ga_format(audio_in["format"], f"{p}.format"))
        if "transcription" in audio_in:
            s = _transcription(s, audio_in["transcription"], f"{p}.transcription")
        if "turn_detection" in audio_in:
            td = turn_detection(s, audio_in["turn_detection"], f"{p}.turn_detection")
            s = dataclasses.replace(s, turn_detection=td)
    audio_out = f.obj(audio, "output", f"{path}.audio")
    if audio_out is not None:
        p = f"{path}.audio.output"
        _check_keys(audio_out, {"format", "voice", "speed"}, p)
        if "format" in audio_out:
            s = dataclasses.replace(s, output_format=ga_format(audio_out["format"], f"{p}.format"))
        s = _voice_speed(s, audio_out, p)
    return s


def update_beta(
    s: RealtimeSettings, session: Obj, *, transcription: bool = False
) -> RealtimeSettings:
    """Beta's session.update, or (transcription=True) its transcription_session.update."""
    path = "session"
    if transcription:
        if s.kind != "transcription":
            raise f.bad_value("type", "transcription_session.update needs ?intent=transcription")
        known = {"input_audio_format", "input_audio_transcription", "turn_detection", "modalities"}
    else:
        known = BETA_KEYS
    _check_keys(session, known, path)
    if not transcription:
        s = _common(s, session, path)
        s = _voice_speed(s, session, path)
        modalities = f.listed(session, "modalities", path)
        if modalities is not None:
            s = dataclasses.replace(s, output_modalities=modalities_of(modalities, path, beta=True))
        if "max_response_output_tokens" in session:
            tokens = max_tokens(
                session["max_response_output_tokens"], f"{path}.max_response_output_tokens"
            )
            s = dataclasses.replace(s, max_output_tokens=tokens)
        fmt = f.choice(session, "output_audio_format", path, tuple(BETA_FORMATS))
        if fmt is not None:
            s = dataclasses.replace(s, output_format=BETA_FORMATS[fmt])
    fmt = f.choice(session, "input_audio_format", path, tuple(BETA_FORMATS))
    if fmt is not None:
        s = dataclasses.replace(s, input_format=BETA_FORMATS[fmt])
    if "input_audio_transcription" in session:
        p = f"{path}.input_audio_transcription"
        s = _transcription(s, session["input_audio_transcription"], p)
    if "turn_detection" in session:
        td = turn_detection(s, session["turn_detection"], f"{path}.turn_detection")
        s = dataclasses.replace(s, turn_detection=td)
    return s


def _common(s: RealtimeSettings, session: Obj, path: str) -> RealtimeSettings:
    """The fields GA and beta name alike."""
    model = f.string(session, "model", path, limit=f.MAX_ID)
    instructions = f.string(session, "instructions", path, limit=MAX_TEXT)
    s = dataclasses.replace(
        s,
        model=s.model if model is None else model,
        instructions=s.instructions if instructions is None else instructions,
    )
    tools = f.listed(session, "tools", path)
    if tools is not None:
        s = dataclasses.replace(s, tools=tools_of(tools, f"{path}.tools"))
    if session.get("tool_choice") is not None:
        s = dataclasses.replace(s, tool_choice=tool_choice_of(session["tool_choice"], path))
    return s


def _voice_speed(s: RealtimeSettings, data: Obj, path: str) -> RealtimeSettings:
    voice = voice_of(data, path)
    speed = f.number(data, "speed", path, *SPEED)
    return dataclasses.replace(
        s, voice=s.voice if voice is None else voice, speed=s.speed if speed is None else speed
    )


def voice_of(data: Obj, path: str) -> str | None:
    """A voice name, or GA's custom-voice object {id}."""
    value = data.get("voice")
    if isinstance(value, dict):
        return f.string(value, "id", f"{path}.voice", required=True, limit=f.MAX_ID)
    return f.string(data, "voice", path, limit=f.MAX_ID)


def ga_format(value: object, path: str) -> Format:
    """{type: audio/pcm, rate: 24000} | {type: audio/pcmu} | {type: audio/pcma}."""
    if value is None:
        raise f.invalid(f"{path} must be an object")
    if not isinstance(value, dict):
        raise f.invalid(f"{path} must be an object")
    kind = value.get("type", "audio/pcm")
    if not isinstance(kind, str) or kind not in FORMAT_RATES:
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"{path}.type {quoted(kind)} is not supported; use audio/pcm, audio/pcmu or audio/pcma",
        )
    rate = value.get("rate")
    if rate is not None and rate != FORMAT_RATES[kind]:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"{path}.rate {quoted(rate)} is not supported; {kind} is {FORMAT_RATES[kind]} Hz",
        )
    fmt: Format = kind
    return fmt


_SERVER_VAD_ONLY = ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms")


def turn_detection(s: RealtimeSettings, value: object, path: str) -> TurnDetection | None:
    """null: push-to-talk. server_vad: a fixed silence ends the turn; semantic_vad: the
    silence adapts to what was said, as eager as `eagerness` (pipeline/turns/endpointing.py),
    OpenAI's fields for each (a field of the other type is refused, naming it)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise f.invalid(f"{path} must be an object or null")
    _check_keys(
        value,
        {"type", "create_response", "interrupt_response", "eagerness", *_SERVER_VAD_ONLY},
        path,
    )
    kind = f.choice(value, "type", path, TURN_TYPES) or "server_vad"
    create = f.boolean(value, "create_response", path)
    interrupt = f.boolean(value, "interrupt_response", path)
    create_response = (s.kind == "realtime") if create is None else create
    interrupt_response = True if interrupt is None else interrupt
    if kind == "semantic_vad":
        for key in _SERVER_VAD_ONLY:
            if value.get(key) is not None:
                raise f.bad_value(f"{path}.{key}", "is a server_vad field, not semantic_vad's")
        eagerness = f.choice(value, "eagerness", path, EAGERNESS) or "auto"
        return TurnDetection(
            type="semantic_vad",
            eagerness=cast(Eagerness, eagerness),
            create_response=create_response,
            interrupt_response=interrupt_response,
        )
    if value.get("eagerness") is not None:
        raise f.bad_value(f"{path}.eagerness", "is a semantic_vad field, not server_vad's")
    if value.get("idle_timeout_ms") is not None:
        raise f.bad_value(f"{path}.idle_timeout_ms", "is not supported (use null)")
    return TurnDetection(
        threshold=f.number(value, "threshold", path, 0.0, 1.0),
        prefix_padding_ms=f.integer(value, "prefix_padding_ms", path, 0, MAX_PADDING_MS),
        silence_duration_ms=f.integer(value, "silence_duration_ms", path, *SILENCE_MS),
        create_response=create_response,
        interrupt_response=interrupt_response,
    )


def _transcription(s: RealtimeSettings, value: object, path: str) -> RealtimeSettings:
    if value is None:
        return dataclasses.replace(s, transcription=None)
    if not isinstance(value, dict):
        raise f.invalid(f"{path} must be an object or null")
    _check_keys(value, {"model", "language", "prompt"}, path)
    current = s.transcription
    model = f.string(value, "model", path, limit=f.MAX_ID)
    language = f.string(value, "language", path, limit=16)
    prompt = f.string(value, "prompt", path, limit=MAX_TEXT)
    return dataclasses.replace(
        s,
        transcription=Transcription(
            model=model or (current.model if current else "voxserve"),
            language=language,
            prompt=prompt,
        ),
    )


def modalities_of(values: list[Any], path: str, *, beta: bool) -> tuple[Modality, ...]:
    """["audio"] (speech and its transcript) or ["text"]; beta's ["text", "audio"] is audio."""
    if not values or not all(v in ("audio", "text") for v in values):
        raise f.bad_value(path, 'must be ["audio"] or ["text"]')
    kinds = set(values)
    if not kinds <= {"audio", "text"}:
        raise f.bad_value(path, 'must be ["audio"] or ["text"]')
    if "audio" in kinds and "text" in kinds and not beta:
        raise f.bad_value(path, 'cannot be both: ["audio"] includes its transcript')
    return ("audio",) if "audio" in kinds else ("text",)


def max_tokens(value: object, path: str) -> int | None:
    if value is None or value == "inf":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
        raise f.bad_value(path, f'must be 1 to {MAX_TOKENS} or "inf"')
    return value


def tools_of(values: list[Any], path: str) -> tuple[ToolSpec, ...]:
    if len(values) > MAX_TOOLS:
        raise f.bad_value(path, f"has more than {MAX_TOOLS} tools")
    tools = []
    for i, tool in enumerate(values):
        p = f"{path}[{i}]"
        if not isinstance(tool, dict):
            raise f.invalid(f"{p} must be an object")
        if tool.get("type", "function") != "function":
            raise f.bad_value(
                f"{p}.type", f"{quoted(tool.get('type'))} is not supported: only function tools"
            )
        name = f.string(tool, "name", p, required=True, limit=f.MAX_ID)
        assert name is not None
        parameters = f.obj(tool, "parameters", p)
        description = f.string(tool, "description", p, limit=MAX_TEXT) or ""
        tools.append(ToolSpec(name, description, parameters))
    return tuple(tools)


def tool_choice_of(value: object, path: str) -> str:
    """auto | none | required | a function's name (GA: {type: function, name})."""
    if isinstance(value, dict):
        if value.get("type") != "function":
            raise f.bad_value(f"{path}.tool_choice.type", "must be function")
        name = f.string(value, "name", f"{path}.tool_choice", required=True, limit=f.MAX_ID)
        assert name is not None
        return name
    if value not in TOOL_CHOICES:
        raise f.bad_value(
            f"{path}.tool_choice", f"{quoted(value)} is not one of auto, none, required"
        )
    return str(value)
