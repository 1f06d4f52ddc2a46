from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_ASR: _ClassVar[Mode]
    MODE_TTS: _ClassVar[Mode]
    MODE_ASSISTANT: _ClassVar[Mode]
MODE_UNSPECIFIED: Mode
MODE_ASR: Mode
MODE_TTS: Mode
MODE_ASSISTANT: Mode

class StreamConfig(_message.Message):
    __slots__ = ("mode", "sample_rate", "encoding", "language", "voice", "output_sample_rate", "speed", "partials", "chunk_ms", "trace_id", "turn_detection")
    MODE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    PARTIALS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_MS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_DETECTION_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    sample_rate: int
    encoding: str
    language: str
    voice: str
    output_sample_rate: int
    speed: float
    partials: bool
    chunk_ms: int
    trace_id: str
    turn_detection: TurnDetection
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., sample_rate: _Optional[int] = ..., encoding: _Optional[str] = ..., language: _Optional[str] = ..., voice: _Optional[str] = ..., output_sample_rate: _Optional[int] = ..., speed: _Optional[float] = ..., partials: _Optional[bool] = ..., chunk_ms: _Optional[int] = ..., trace_id: _Optional[str] = ..., turn_detection: _Optional[_Union[TurnDetection, _Mapping]] = ...) -> None: ...

class TurnDetection(_message.Message):
    __slots__ = ("type", "eagerness", "silence_duration_ms")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EAGERNESS_FIELD_NUMBER: _ClassVar[int]
    SILENCE_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    type: str
    eagerness: str
    silence_duration_ms: int
    def __init__(self, type: _Optional[str] = ..., eagerness: _Optional[str] = ..., silence_duration_ms: _Optional[int] = ...) -> None: ...

class RecognitionConfig(_message.Message):
    __slots__ = ("sample_rate", "encoding", "language", "partials", "chunk_ms", "trace_id")
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    PARTIALS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_MS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    sample_rate: int
    encoding: str
    language: str
    partials: bool
    chunk_ms: int
    trace_id: str
    def __init__(self, sample_rate: _Optional[int] = ..., encoding: _Optional[str] = ..., language: _Optional[str] = ..., partials: _Optional[bool] = ..., chunk_ms: _Optional[int] = ..., trace_id: _Optional[str] = ...) -> None: ...

class AudioFrames(_message.Message):
    __slots__ = ("seq_id", "pcm")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    PCM_FIELD_NUMBER: _ClassVar[int]
    seq_id: int
    pcm: bytes
    def __init__(self, seq_id: _Optional[int] = ..., pcm: _Optional[bytes] = ...) -> None: ...

class TextInput(_message.Message):
    __slots__ = ("text", "flush")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    text: str
    flush: bool
    def __init__(self, text: _Optional[str] = ..., flush: _Optional[bool] = ...) -> None: ...

class EndInput(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cancel(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Mark(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ConverseRequest(_message.Message):
    __slots__ = ("config", "audio", "text", "end", "cancel", "mark")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    config: StreamConfig
    audio: AudioFrames
    text: TextInput
    end: EndInput
    cancel: Cancel
    mark: Mark
    def __init__(self, config: _Optional[_Union[StreamConfig, _Mapping]] = ..., audio: _Optional[_Union[AudioFrames, _Mapping]] = ..., text: _Optional[_Union[TextInput, _Mapping]] = ..., end: _Optional[_Union[EndInput, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., mark: _Optional[_Union[Mark, _Mapping]] = ...) -> None: ...

class RecognizeRequest(_message.Message):
    __slots__ = ("config", "audio")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    config: RecognitionConfig
    audio: AudioFrames
    def __init__(self, config: _Optional[_Union[RecognitionConfig, _Mapping]] = ..., audio: _Optional[_Union[AudioFrames, _Mapping]] = ...) -> None: ...

class SessionStarted(_message.Message):
    __slots__ = ("session_id", "trace_id", "mode", "sample_rate", "encoding", "language", "voice", "output_sample_rate", "frame_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    FRAME_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    trace_id: str
    mode: Mode
    sample_rate: int
    encoding: str
    language: str
    voice: str
    output_sample_rate: int
    frame_ms: int
    def __init__(self, session_id: _Optional[str] = ..., trace_id: _Optional[str] = ..., mode: _Optional[_Union[Mode, str]] = ..., sample_rate: _Optional[int] = ..., encoding: _Optional[str] = ..., language: _Optional[str] = ..., voice: _Optional[str] = ..., output_sample_rate: _Optional[int] = ..., frame_ms: _Optional[int] = ...) -> None: ...

class VadStart(_message.Message):
    __slots__ = ("segment", "start_ms")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    segment: int
    start_ms: int
    def __init__(self, segment: _Optional[int] = ..., start_ms: _Optional[int] = ...) -> None: ...

class VadEnd(_message.Message):
    __slots__ = ("segment", "start_ms", "end_ms")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    segment: int
    start_ms: int
    end_ms: int
    def __init__(self, segment: _Optional[int] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ...) -> None: ...

class Transcript(_message.Message):
    __slots__ = ("segment", "text", "is_final", "start_ms", "end_ms", "language")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    segment: int
    text: str
    is_final: bool
    start_ms: int
    end_ms: int
    language: str
    def __init__(self, segment: _Optional[int] = ..., text: _Optional[str] = ..., is_final: _Optional[bool] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., language: _Optional[str] = ...) -> None: ...

class ResponseText(_message.Message):
    __slots__ = ("reply", "text")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    reply: int
    text: str
    def __init__(self, reply: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class TtsStart(_message.Message):
    __slots__ = ("reply", "voice", "sample_rate", "encoding")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    reply: int
    voice: str
    sample_rate: int
    encoding: str
    def __init__(self, reply: _Optional[int] = ..., voice: _Optional[str] = ..., sample_rate: _Optional[int] = ..., encoding: _Optional[str] = ...) -> None: ...

class AudioOut(_message.Message):
    __slots__ = ("reply", "pcm")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    PCM_FIELD_NUMBER: _ClassVar[int]
    reply: int
    pcm: bytes
    def __init__(self, reply: _Optional[int] = ..., pcm: _Optional[bytes] = ...) -> None: ...

class TtsEnd(_message.Message):
    __slots__ = ("reply", "chunks", "audio_ms", "interrupted", "played_ms")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_MS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    PLAYED_MS_FIELD_NUMBER: _ClassVar[int]
    reply: int
    chunks: int
    audio_ms: int
    interrupted: bool
    played_ms: int
    def __init__(self, reply: _Optional[int] = ..., chunks: _Optional[int] = ..., audio_ms: _Optional[int] = ..., interrupted: _Optional[bool] = ..., played_ms: _Optional[int] = ...) -> None: ...

class BargeIn(_message.Message):
    __slots__ = ("segment",)
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    segment: int
    def __init__(self, segment: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "fatal", "stage", "segment", "reply")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    fatal: bool
    stage: str
    segment: int
    reply: int
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., fatal: _Optional[bool] = ..., stage: _Optional[str] = ..., segment: _Optional[int] = ..., reply: _Optional[int] = ...) -> None: ...

class SessionEnded(_message.Message):
    __slots__ = ("session_id", "trace_id", "received", "duplicates", "accepted", "processed", "dropped", "rejected", "gaps", "reordered", "segments", "replies", "interrupted", "duration_ms", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    GAPS_FIELD_NUMBER: _ClassVar[int]
    REORDERED_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    trace_id: str
    received: int
    duplicates: int
    accepted: int
    processed: int
    dropped: int
    rejected: int
    gaps: int
    reordered: int
    segments: int
    replies: int
    interrupted: int
    duration_ms: int
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., trace_id: _Optional[str] = ..., received: _Optional[int] = ..., duplicates: _Optional[int] = ..., accepted: _Optional[int] = ..., processed: _Optional[int] = ..., dropped: _Optional[int] = ..., rejected: _Optional[int] = ..., gaps: _Optional[int] = ..., reordered: _Optional[int] = ..., segments: _Optional[int] = ..., replies: _Optional[int] = ..., interrupted: _Optional[int] = ..., duration_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ConverseResponse(_message.Message):
    __slots__ = ("started", "vad_start", "vad_end", "transcript", "response_delta", "response_text", "tts_start", "audio", "tts_end", "barge_in", "mark", "error", "ended")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    VAD_START_FIELD_NUMBER: _ClassVar[int]
    VAD_END_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_DELTA_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    TTS_START_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    TTS_END_FIELD_NUMBER: _ClassVar[int]
    BARGE_IN_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    started: SessionStarted
    vad_start: VadStart
    vad_end: VadEnd
    transcript: Transcript
    response_delta: ResponseText
    response_text: ResponseText
    tts_start: TtsStart
    audio: AudioOut
    tts_end: TtsEnd
    barge_in: BargeIn
    mark: Mark
    error: Error
    ended: SessionEnded
    def __init__(self, started: _Optional[_Union[SessionStarted, _Mapping]] = ..., vad_start: _Optional[_Union[VadStart, _Mapping]] = ..., vad_end: _Optional[_Union[VadEnd, _Mapping]] = ..., transcript: _Optional[_Union[Transcript, _Mapping]] = ..., response_delta: _Optional[_Union[ResponseText, _Mapping]] = ..., response_text: _Optional[_Union[ResponseText, _Mapping]] = ..., tts_start: _Optional[_Union[TtsStart, _Mapping]] = ..., audio: _Optional[_Union[AudioOut, _Mapping]] = ..., tts_end: _Optional[_Union[TtsEnd, _Mapping]] = ..., barge_in: _Optional[_Union[BargeIn, _Mapping]] = ..., mark: _Optional[_Union[Mark, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., ended: _Optional[_Union[SessionEnded, _Mapping]] = ...) -> None: ...

class RecognizeResponse(_message.Message):
    __slots__ = ("started", "vad_start", "vad_end", "transcript", "error", "ended")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    VAD_START_FIELD_NUMBER: _ClassVar[int]
    VAD_END_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    started: SessionStarted
    vad_start: VadStart
    vad_end: VadEnd
    transcript: Transcript
    error: Error
    ended: SessionEnded
    def __init__(self, started: _Optional[_Union[SessionStarted, _Mapping]] = ..., vad_start: _Optional[_Union[VadStart, _Mapping]] = ..., vad_end: _Optional[_Union[VadEnd, _Mapping]] = ..., transcript: _Optional[_Union[Transcript, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., ended: _Optional[_Union[SessionEnded, _Mapping]] = ...) -> None: ...

class SynthesizeRequest(_message.Message):
    __slots__ = ("text", "voice", "speed", "sample_rate", "trace_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    voice: str
    speed: float
    sample_rate: int
    trace_id: str
    def __init__(self, text: _Optional[str] = ..., voice: _Optional[str] = ..., speed: _Optional[float] = ..., sample_rate: _Optional[int] = ..., trace_id: _Optional[str] = ...) -> None: ...

class SynthesisStarted(_message.Message):
    __slots__ = ("voice", "sample_rate", "encoding", "trace_id")
    VOICE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    voice: str
    sample_rate: int
    encoding: str
    trace_id: str
    def __init__(self, voice: _Optional[str] = ..., sample_rate: _Optional[int] = ..., encoding: _Optional[str] = ..., trace_id: _Optional[str] = ...) -> None: ...

class SynthesisEnded(_message.Message):
    __slots__ = ("chunks", "audio_ms")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_MS_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    audio_ms: int
    def __init__(self, chunks: _Optional[int] = ..., audio_ms: _Optional[int] = ...) -> None: ...

class SynthesizeResponse(_message.Message):
    __slots__ = ("started", "audio", "ended")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    started: SynthesisStarted
    audio: AudioOut
    ended: SynthesisEnded
    def __init__(self, started: _Optional[_Union[SynthesisStarted, _Mapping]] = ..., audio: _Optional[_Union[AudioOut, _Mapping]] = ..., ended: _Optional[_Union[SynthesisEnded, _Mapping]] = ...) -> None: ...

class ListVoicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Voice(_message.Message):
    __slots__ = ("id", "engine", "language", "sample_rate", "description")
    ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    engine: str
    language: str
    sample_rate: int
    description: str
    def __init__(self, id: _Optional[str] = ..., engine: _Optional[str] = ..., language: _Optional[str] = ..., sample_rate: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class ListVoicesResponse(_message.Message):
    __slots__ = ("voices", "default_voice")
    VOICES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VOICE_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedCompositeFieldContainer[Voice]
    default_voice: str
    def __init__(self, voices: _Optional[_Iterable[_Union[Voice, _Mapping]]] = ..., default_voice: _Optional[str] = ...) -> None: ...

class ListEnginesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Engine(_message.Message):
    __slots__ = ("kind", "name", "package", "version", "license", "model", "languages")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LICENSE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    package: str
    version: str
    license: str
    model: str
    languages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., package: _Optional[str] = ..., version: _Optional[str] = ..., license: _Optional[str] = ..., model: _Optional[str] = ..., languages: _Optional[_Iterable[str]] = ...) -> None: ...

class ListEnginesResponse(_message.Message):
    __slots__ = ("engines", "models")
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    engines: _containers.RepeatedCompositeFieldContainer[Engine]
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, engines: _Optional[_Iterable[_Union[Engine, _Mapping]]] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...
