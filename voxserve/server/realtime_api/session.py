"""A Realtime connection's session as the client sees it (`RealtimeSettings`), the
StreamConfig it opens or updates the voxserve session with, and the `session` object of
session.created/updated (GA shape, or beta's when the client speaks beta names).

`RealtimeWire` is the per-connection state the decoder (realtime_api/codec.py) and the encoder
(realtime_api/events.py) share: the settings in force, the updates sent to the session and not
yet answered (`pending`, applied on session.updated in order, the first dropped when the
session refuses one), whether the client speaks beta names, and the decoder's refusals,
so an error event carries the client event's id. It holds no conversation content.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from voxserve.config import VadConfig
from voxserve.engines.loaded import Engines
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.events import ConversationConfig, ResponseOptions, StreamConfig, ToolSpec
from voxserve.events import TurnDetection as TurnDetection
from voxserve.server.session.openai_voices import (
    OPENAI_VOICES,
    installed_voice,
    openai_picks,
    picks_of,
    voice_names,
)
from voxserve.server.session.stream_protocol import parse_start

Format = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
FORMAT_RATES: dict[Format, int] = {"audio/pcm": 24_000, "audio/pcmu": 8_000, "audio/pcma": 8_000}
BETA_FORMATS: dict[str, Format] = {
    "pcm16": "audio/pcm",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
}
BETA_NAMES: dict[Format, str] = {fmt: name for name, fmt in BETA_FORMATS.items()}
Kind = Literal["realtime", "transcription"]
# Where the session's audio travels: in events on the socket (/v1/realtime: `audio.*.format`
# applies), or on WebRTC media tracks (/v1/realtime/calls: Opus at 48 kHz, decoded and
# resampled by the call to TRACK_INPUT_RATE, the reply made at TRACK_OUTPUT_RATE; the
# formats a client sets are reported back but change nothing, as OpenAI's WebRTC).
Media = Literal["socket", "track"]
TRACK_INPUT_RATE = 16_000  # what the engines take: the call resamples Opus's 48 kHz once
TRACK_OUTPUT_RATE = 48_000  # Opus's own rate: the pipeline resamples the voice once
Modality = Literal["audio", "text"]
UPDATE_STAGE = "session.update"
"""The `stage` of the VoxError a session raises when it refuses a SessionUpdate: the encoder
then drops that proposal (the settings in force stay) and the error carries its event_id."""
MAX_REFUSALS = 64  # decoder refusals awaiting their error event (a fatal end may drop some)
# The subprotocols a /v1/realtime handshake may offer (read by the door and the Host guard).
SUBPROTOCOL = "realtime"  # what browsers offer besides the key; selected when offered
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."  # never selected: its name is the key
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"  # a browser's `OpenAI-Beta: realtime=v1`


@dataclass(frozen=True, slots=True)
class Transcription:
    """Input transcription (`audio.input.transcription`): `model` chooses the ASR model
    among the configured ones ([models]; OpenAI's names mean the default; reported back as
    given); `prompt` is reported, not used."""

    model: str
    language: str | None = None
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class Installed:
    """What the server has, which the session object reports and voices map onto."""

    voices: tuple[str, ...]
    default_voice: str
    asr_model: str = "voxserve"
    vad_threshold: float = 0.5  # settings.vad: what a turn_detection None field means
    vad_prefix_padding_ms: int = 200
    vad_silence_duration_ms: int = 500
    # OpenAI name -> installed voice (openai_voices.openai_picks, with settings.tts.openai_voices)
    openai_voices: tuple[tuple[str, str], ...] = ()


def installed_of(
    engines: Engines, vad: VadConfig, openai_voices: Mapping[str, str] | None = None
) -> Installed:
    """What a server's loaded engines, VAD settings and OpenAI voice table
    (settings.tts.openai_voices) give the Realtime session object."""
    return Installed(
        voices=voice_names(engines.voices()),
        default_voice=engines.default_voice,
        asr_model=engines.asr.info.model or engines.asr.info.name,
        vad_threshold=vad.threshold,
        vad_prefix_padding_ms=vad.pad_ms,
        vad_silence_duration_ms=vad.hangover_ms,
        openai_voices=tuple(
            picks_of(engines.voices(), engines.default_voice, openai_voices).items()
        ),
    )


@dataclass(frozen=True, slots=True)
class RealtimeSettings:
    """The session as the client configured it (names as it gave them: the voice too)."""

    kind: Kind
    model: str
    voice: str
    input_format: Format = "audio/pcm"
    output_format: Format = "audio/pcm"
    speed: float = 1.0
    instructions: str = ""
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: Transcription | None = None
    output_modalities: tuple[Modality, ...] = ("audio",)
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    max_output_tokens: int | None = None  # None: "inf"


@dataclass(slots=True)
class Pending:
    settings: RealtimeSettings
    event_id: str | None


@dataclass(slots=True)
class RealtimeWire:
    """Per-connection state of the codec (module docstring)."""

    settings: RealtimeSettings
    installed: Installed
    trace_id: str
    beta: bool = False
    session_id: str = ""  # set from session.started (the encoder)
    media: Media = "socket"
    pending: deque[Pending] = field(default_factory=deque)
    refusals: deque[tuple[str, str, str | None]] = field(
        default_factory=lambda: deque(maxlen=MAX_REFUSALS)
    )

    @property
    def latest(self) -> RealtimeSettings:
        """The settings as the client last asked (what its next audio is decoded with)."""
        return self.pending[-1].settings if self.pending else self.settings

    def config(self, settings: RealtimeSettings | None = None) -> StreamConfig:
        return stream_config(settings or self.settings, self.installed, self.trace_id, self.media)

    def propose(self, settings: RealtimeSettings, event_id: str | None) -> StreamConfig:
        config = self.config(settings)  # raises before anything is proposed
        self.pending.append(Pending(settings, event_id))
        return config

    def applied(self) -> None:
        """session.updated: the oldest proposal is in force."""
        if self.pending:
            self.settings = self.pending.popleft().settings

    def refused(self) -> str | None:
        """The session refused the oldest proposal: dropped; its client event id."""
        return self.pending.popleft().event_id if self.pending else None


def initial_wire(
    installed: Installed,
    *,
    model: str,
    kind: Kind = "realtime",
    beta: bool = False,
    trace_id: str = "",
    media: Media = "socket",
) -> RealtimeWire:
    """The state a /v1/realtime connection opens with (before any session.update): 24 kHz
    PCM both ways, server VAD, the server's default voice, input transcription on (the
    transcript is voxserve's ASR output, which it makes anyway); `kind` transcription
    (`?intent=transcription`): no responses."""
    settings = RealtimeSettings(
        kind=kind,
        model=model,
        voice=installed.default_voice,
        transcription=Transcription(installed.asr_model),
        turn_detection=TurnDetection(create_response=kind == "realtime"),
    )
    # parse_start validates and makes a trace id where the handshake has none.
    trace = parse_start({"mode": "assistant", "trace_id": trace_id or None}).trace_id
    return RealtimeWire(settings, installed, trace, beta=beta, media=media)


def voice_id(name: str, installed: Installed) -> str:
    """The installed voice `name` selects (server/session/openai_voices.py); `unknown_voice` for a
    name that selects none (checked here so that a refused session.update never reaches
    the session; the session checks again)."""
    # An Installed made without picks (tests, tools): the rule over its names alone.
    picks = dict(installed.openai_voices) or openai_picks(installed.voices, installed.default_voice)
    voice = installed_voice(name, installed.voices, picks)
    if installed.voices and voice not in installed.voices:
        valid = ", ".join(sorted(installed.voices))
        raise VoxError(
            ErrorCode.UNKNOWN_VOICE,
            f"unknown voice {quoted(name)}; valid voices: {valid}; "
            f"OpenAI names: {', '.join(OPENAI_VOICES)}",
        )
    return voice


def stream_config(
    s: RealtimeSettings, installed: Installed, trace_id: str, media: Media = "socket"
) -> StreamConfig:
    """The voxserve session's config for settings `s` (validated by ws_protocol.parse_start,
    as every transport's): G.711 is decoded to PCM16 by the codec, so the session sees
    PCM16 at 8 kHz; on media tracks the rates are the call's (`Media`)."""
    voice = voice_id(s.voice, installed)
    if media == "track":
        in_rate, out_rate = TRACK_INPUT_RATE, TRACK_OUTPUT_RATE
    else:
        in_rate, out_rate = FORMAT_RATES[s.input_format], FORMAT_RATES[s.output_format]
    base = parse_start(
        {
            "mode": "assistant",
            "sample_rate": in_rate,
            "output_sample_rate": out_rate,
            "voice": voice,
            "language": s.transcription.language if s.transcription else None,
            "speed": s.speed,
            "trace_id": trace_id,
        }
    )
    response = ResponseOptions(
        instructions=s.instructions or None,
        tools=s.tools,
        tool_choice=s.tool_choice,
        output_modalities=s.output_modalities,
        voice=voice,
        max_output_tokens=s.max_output_tokens,
        voice_name=s.voice,
    )
    conversation = ConversationConfig(
        responds=s.kind == "realtime",
        turn_detection=s.turn_detection,
        transcribe=s.transcription is not None or s.kind == "transcription",
        response=response,
    )
    return dataclasses.replace(base, conversation=conversation, model=asr_model(s, installed))


def asr_model(s: RealtimeSettings, installed: Installed) -> str | None:
    """The ASR model the transcription names (a [models] name or alias, OpenAI's names
    meaning the default); None: the default (no transcription, or the name the server
    reported: its own model, or "voxserve")."""
    t = s.transcription
    if t is None or t.model in ("", "voxserve", installed.asr_model):
        return None
    return t.model


# --- the session object -------------------------------------------------------------------


def audio_format(fmt: Format) -> dict[str, Any]:
    return {"type": fmt, "rate": 24_000} if fmt == "audio/pcm" else {"type": fmt}


TOOL_CHOICES = ("auto", "none", "required")


def tool_choice(choice: str) -> str | dict[str, str]:
    """GA's form: a mode, or the function the model must call."""
    return choice if choice in TOOL_CHOICES else {"type": "function", "name": choice}


def tool_dict(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters or {"type": "object", "properties": {}},
    }


def _turn_detection(s: RealtimeSettings, installed: Installed) -> dict[str, Any] | None:
    td = s.turn_detection
    if td is None:
        return None
    if td.type == "semantic_vad":
        return {
            "type": "semantic_vad",
            "eagerness": td.eagerness,
            "create_response": td.create_response,
            "interrupt_response": td.interrupt_response,
        }
    return {
        "type": "server_vad",
        "threshold": installed.vad_threshold if td.threshold is None else td.threshold,
        "prefix_padding_ms": (
            installed.vad_prefix_padding_ms
            if td.prefix_padding_ms is None
            else td.prefix_padding_ms
        ),
        "silence_duration_ms": (
            installed.vad_silence_duration_ms
            if td.silence_duration_ms is None
            else td.silence_duration_ms
        ),
        "create_response": td.create_response,
        "interrupt_response": td.interrupt_response,
    }


def _transcription(s: RealtimeSettings) -> dict[str, Any] | None:
    t = s.transcription
    if t is None:
        return None
    return {"model": t.model, "language": t.language, "prompt": t.prompt}


def describe(wire: RealtimeWire) -> dict[str, Any]:
    """The `session` object of session.created/updated for the settings in force."""
    s, beta = wire.settings, wire.beta
    sid = f"sess_{wire.session_id}"
    vad = _turn_detection(s, wire.installed)
    transcription = _transcription(s)
    if beta:
        described: dict[str, Any] = {
            "id": sid,
            "object": "realtime.transcription_session"
            if s.kind == "transcription"
            else "realtime.session",
            "input_audio_format": BETA_NAMES[s.input_format],
            "input_audio_transcription": transcription,
            "turn_detection": vad,
            "input_audio_noise_reduction": None,
        }
        if s.kind == "transcription":
            # Beta's transcription session names its ephemeral key; voxserve has none (the
            # connection authenticated with the API key): an empty one that never expires.
            secret = {"value": "", "expires_at": 0}
            return described | {"modalities": ["text"], "client_secret": secret}
        return described | {
            "model": s.model,
            "modalities": ["text", "audio"] if "audio" in s.output_modalities else ["text"],
            "instructions": s.instructions,
            "voice": s.voice,
            "output_audio_format": BETA_NAMES[s.output_format],
            "speed": s.speed,
            "tools": [tool_dict(t) for t in s.tools],
            "tool_choice": s.tool_choice,
            "max_response_output_tokens": s.max_output_tokens or "inf",
        }
    audio_in = {
        "format": audio_format(s.input_format),
        "transcription": transcription,
        "noise_reduction": None,
        "turn_detection": vad,
    }
    if s.kind == "transcription":
        return {
            "id": sid,
            "object": "realtime.transcription_session",
            "type": "transcription",
            "audio": {"input": audio_in},
            "include": None,
        }
    return {
        "id": sid,
        "object": "realtime.session",
        "type": "realtime",
        "model": s.model,
        "output_modalities": list(s.output_modalities),
        "instructions": s.instructions,
        "tools": [tool_dict(t) for t in s.tools],
        "tool_choice": tool_choice(s.tool_choice),
        "max_output_tokens": s.max_output_tokens or "inf",
        "tracing": None,
        "prompt": None,
        "include": None,
        "audio": {
            "input": audio_in,
            "output": {
                "format": audio_format(s.output_format),
                "voice": s.voice,
                "speed": s.speed,
            },
        },
    }
