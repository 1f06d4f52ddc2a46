"""Error codes every transport reports; the table in docs/protocol.md mirrors ErrorCode."""

from __future__ import annotations

from enum import StrEnum

from voxserve.events import UNSET, ErrorEvent


class ErrorCode(StrEnum):
    """Stable, documented codes. Values never change once released."""

    # client protocol errors (the client can fix these)
    NOT_STARTED = "not_started"  # audio or text before session.start
    ALREADY_STARTED = "already_started"
    INVALID_JSON = "invalid_json"
    INVALID_MESSAGE = "invalid_message"  # unknown type, missing/ill-typed field
    UNKNOWN_MODE = "unknown_mode"
    UNKNOWN_VOICE = "unknown_voice"
    UNKNOWN_LANGUAGE = "unknown_language"
    UNKNOWN_WAKE_WORD = "unknown_wake_word"  # not an enabled wake model; lists the valid ones
    UNKNOWN_MODEL = "unknown_model"  # a request's `model` is not configured; lists the valid ones
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"
    UNSUPPORTED_ENCODING = "unsupported_encoding"
    ODD_LENGTH_PCM = "odd_length_pcm"
    FRAME_TOO_SHORT = "frame_too_short"  # binary message shorter than its seq header
    FRAME_TOO_LARGE = "frame_too_large"
    MESSAGE_TOO_LARGE = "message_too_large"
    TEXT_TOO_LONG = "text_too_long"
    EMPTY_TEXT = "empty_text"
    EMPTY_AUDIO = "empty_audio"
    INVALID_AUDIO = "invalid_audio"  # not a WAV / unreadable upload
    INVALID_PARAMETER = "invalid_parameter"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # a JSON route's body not application/json
    WRONG_MODE = "wrong_mode"  # e.g. text in an asr session
    # conversation sessions (the Realtime API's own codes, so its clients recognise them)
    RESPONSE_ACTIVE = "conversation_already_has_active_response"  # response.create meanwhile
    RESPONSE_NOT_ACTIVE = "response_cancel_not_active"  # response.cancel with none running
    TOO_MANY_TOOL_CALLS = "too_many_tool_calls"  # past realtime.max_tool_calls_per_turn
    # WebRTC calls (POST /v1/realtime/calls, docs/webrtc.md)
    INVALID_SDP = "invalid_sdp"  # not an SDP offer with an audio m-line and a data channel
    CALL_NOT_FOUND = "call_not_found"  # DELETE / hangup of a call that is not (or no longer) up
    WEBRTC_UNAVAILABLE = "webrtc_unavailable"  # the webrtc extra (aiortc) is not installed
    # Realtime client secrets (POST /v1/realtime/client_secrets, docs/realtime.md)
    SESSION_TOO_LARGE = "session_too_large"  # over realtime.max_client_secret_session_bytes
    # server side
    STAGE_TIMEOUT = "stage_timeout"
    ENGINE_ERROR = "engine_error"
    ENGINE_UNAVAILABLE = "engine_unavailable"  # a remote engine's server unreachable or busy
    OVERLOADED = "overloaded"
    QUOTA_EXCEEDED = "quota_exceeded"  # a per-key quota (quotas.*): sessions, rate, audio
    IDLE_TIMEOUT = "idle_timeout"  # no message from the client for limits.idle_timeout_s
    SESSION_EXPIRED = "session_expired"  # the session outlived limits.max_session_s
    TTS_DEGRADED = "tts_degraded"  # TTS is saturated: only cached speech is served
    NOT_READY = "not_ready"
    MODEL_UNAVAILABLE = "model_unavailable"  # a configured model could not be loaded
    SHUTTING_DOWN = "shutting_down"  # the server is draining (SIGTERM): connect elsewhere
    CLIENT_STALLED = "client_stalled"  # the client stopped reading for limits.stalled_client_s
    RESUME_FAILED = "resume_failed"  # no parked session with that id (expired, or never was)
    WYOMING_LIMIT = "wyoming_limit"  # Wyoming's own share: wyoming.max_sessions, connections
    STORAGE_UNAVAILABLE = "storage_unavailable"  # the client-secret store cannot be used
    INTERNAL = "internal"
    # admin routes
    UNAUTHORIZED = "unauthorized"  # missing or wrong API key or admin key
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"  # browser Origin not in cors_allowed_origins
    HOST_NOT_ALLOWED = "host_not_allowed"  # Host not this server's (DNS rebinding)
    ADMIN_DISABLED = "admin_disabled"  # no admin key configured
    # /admin/models (docs/protocol.md, "HTTP")
    MODEL_NOT_FOUND = "model_not_found"  # a name no catalogue knows, or not downloaded
    MODEL_NOT_REMOVABLE = "model_not_removable"  # packaged, or being pulled


class VoxError(Exception):
    """An error with a stable code; `stage` names the pipeline stage it came from, if any."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        fatal: bool = False,
        stage: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal
        self.stage = stage
        self.retry_after_s = retry_after_s  # when to try again (HTTP Retry-After)

    def to_event(
        self,
        *,
        segment: int | None = None,
        reply: int | None = None,
        trace_id: str | None = None,
        retry_after_ms: int | None = None,
    ) -> ErrorEvent:
        """The `error` event telling the client; the keywords add what the error does not
        know itself: the `segment` or `reply` it concerns, the `trace_id` (an internal error,
        for the logs), a `retry_after_ms` when the error has no retry time of its own."""
        if self.retry_after_s is not None:
            retry_after_ms = self.retry_after_s * 1000
        return ErrorEvent(
            code=self.code.value,
            message=self.message,
            fatal=self.fatal,
            stage=UNSET if self.stage is None else self.stage,
            retry_after_ms=UNSET if retry_after_ms is None else retry_after_ms,
            segment=UNSET if segment is None else segment,
            reply=UNSET if reply is None else reply,
            trace_id=UNSET if trace_id is None else trace_id,
        )

    def __repr__(self) -> str:
        return f"VoxError({self.code.value!r}, {self.message!r}, stage={self.stage!r})"


QUOTE_CHARS = 64


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """A client's value as an error message quotes it: its repr (unprintable characters and
    lone surrogates escaped), cut to `limit` characters. A 200 KB voice name echoed whole
    made a 200 KB error body, and overflowed gRPC's trailing metadata, losing the code."""
    return shortened(repr(value), limit)


def shortened(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters (the last three "...") when longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_vox_error(errors: BaseExceptionGroup[BaseException]) -> VoxError | None:
    """The first VoxError in a (nested) exception group, if any: what a client is told."""
    for error in errors.exceptions:
        if isinstance(error, VoxError):
            return error
        if isinstance(error, BaseExceptionGroup):
            found = first_vox_error(error)
            if found is not None:
                return found
    return None
