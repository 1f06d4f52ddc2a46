"""Server settings: defaults, then a TOML/JSON config file, then `VOXSERVE_*` env vars.

Nested keys use a double underscore in env vars: ``VOXSERVE_LIMITS__MAX_SESSIONS=200``.
Every bound written here is a decision; docs/architecture.md says why each default is what it is.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class EngineSpec(BaseModel):
    """One engine: its registry name and the keyword options its constructor takes."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class EnginesConfig(BaseModel):
    vad: EngineSpec = EngineSpec(name="silero")
    asr: EngineSpec = EngineSpec(name="whisper")
    tts: list[EngineSpec] = Field(
        default_factory=lambda: [EngineSpec(name="piper"), EngineSpec(name="espeak")]
    )
    responder: EngineSpec = EngineSpec(name="rules")
    default_voice: str = "joe"
    # Each engine is created with threads=1 unless its options say otherwise, so N
    # concurrent calls use N cores and onnxruntime/CTranslate2 never oversubscribe.
    default_threads: int = 1


class ExecutorConfig(BaseModel):
    min_workers: int = 2
    max_workers: int = 8
    idle_release_s: float = 30.0


class StageConfig(BaseModel):
    """Concurrency (shared by all sessions) and timeout of one engine stage."""

    concurrency: int
    timeout_s: float


class PipelineConfig(BaseModel):
    executor: ExecutorConfig = ExecutorConfig()
    vad: StageConfig = StageConfig(concurrency=2, timeout_s=2.0)
    asr: StageConfig = StageConfig(concurrency=2, timeout_s=15.0)
    responder: StageConfig = StageConfig(concurrency=16, timeout_s=20.0)
    tts: StageConfig = StageConfig(concurrency=2, timeout_s=15.0)  # per chunk
    # 256 frames x 20 ms = 5.12 s of audio buffered between receiver and pipeline (seeds).
    ring_frames: int = 256
    # "wait": the receiver stops reading (TCP pushes back on the client);
    # "drop_oldest": oldest unprocessed audio is dropped and counted in session.ended.
    ring_full_policy: Literal["wait", "drop_oldest"] = "wait"
    dedup_window_ms: int = 500
    # Turn outputs (events, audio chunks) queued per session before the pipeline waits
    # for the socket: bounded so a stalled client cannot grow server memory.
    outbox_messages: int = 256


class VadConfig(BaseModel):
    threshold: float = 0.5
    neg_threshold: float = 0.35
    min_speech_ms: int = 200
    hangover_ms: int = 500  # silence that ends an utterance
    pad_ms: int = 200  # audio kept before speech start and after speech end
    max_utterance_s: float = 25.0  # force an end so one utterance cannot grow unbounded


class AsrConfig(BaseModel):
    partials: bool = True
    partial_interval_ms: int = 640  # re-decode the growing utterance this often
    min_partial_ms: int = 480  # no partial until this much speech


class TtsConfig(BaseModel):
    output_sample_rate: int = 16_000
    max_chunk_ms: int = 200  # audio is sent in chunks of at most this length


class LimitsConfig(BaseModel):
    max_sessions: int = 500
    max_text_chars: int = 4_000
    max_message_bytes: int = 256 * 1024
    max_frame_ms: int = 200  # one binary message may carry up to 10 frames of audio
    max_upload_bytes: int = 25 * 1024 * 1024


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="VOXSERVE_", env_nested_delimiter="__", extra="forbid"
    )

    host: str = "127.0.0.1"
    port: int = 8000
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    engines: EnginesConfig = EnginesConfig()
    pipeline: PipelineConfig = PipelineConfig()
    vad: VadConfig = VadConfig()
    asr: AsrConfig = AsrConfig()
    tts: TtsConfig = TtsConfig()
    limits: LimitsConfig = LimitsConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment variables win over the file, which wins over defaults.
        return (env_settings, init_settings)


class ConfigError(ValueError):
    pass


def read_config_file(path: str | Path) -> dict[str, Any]:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from exc
    try:
        if file.suffix == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {file} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {file} must hold a table/object at the top")
    return data


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Defaults < config file < VOXSERVE_* env vars < explicit overrides (CLI flags)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    data = read_config_file(path) if path else {}
    try:
        settings = Settings(**data)
        if overrides:
            settings = settings.model_copy(
                update={k: v for k, v in overrides.items() if v is not None}
            )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"invalid setting {where}: {first['msg']}") from exc
    except SettingsError as exc:  # e.g. a VOXSERVE_* variable that must be JSON and is not
        raise ConfigError(f"invalid environment setting: {exc}") from exc
    return settings
