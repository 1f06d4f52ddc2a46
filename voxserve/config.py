"""Server settings: defaults, then a TOML/JSON config file, then `VOXSERVE_*` env vars.

Nested keys use a double underscore in env vars: ``VOXSERVE_LIMITS__MAX_SESSIONS=200``.
Every bound written here is a decision; docs/architecture.md says why each default is what it is.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict


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
    # VAD work of all sessions is gathered for up to this long and run as one executor call
    # (one batched model call per window step): hops cost more than silero's windows.
    vad_batch_wait_ms: float = 8.0
    vad_max_batch: int = 64
    # Finals of different sessions ending within this wait run as one Whisper batch
    # (utterances sharing an encoder window encode together; results equal one at a time).
    asr_batch_enabled: bool = True
    asr_batch_wait_ms: float = 30.0
    asr_max_batch: int = 8
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


class DegradeConfig(BaseModel):
    """When TTS cannot keep up, answer from the cache instead of queueing without bound:
    uncached speech gets the fallback phrase (WebSocket) or 503 + Retry-After (HTTP)."""

    enabled: bool = True
    # Degraded when every miss for `sustained_s` (at least `min_slow` of them) waited longer
    # than this for its first audio. Set it well above what the engine takes unloaded (the
    # voxserve_tts_first_audio_seconds{source="miss"} histogram of an idle server): piper's
    # first clause takes 70-330 ms on an idle 2-vCPU box, so 200 ms would degrade it idle.
    first_audio_budget_ms: int = Field(default=800, ge=1)
    sustained_s: float = Field(default=2.0, ge=0)
    min_slow: int = Field(default=3, ge=1)
    # ...or at once when this many syntheses already wait for a TTS slot: the queue never
    # grows past it (2 slots: the 8th in line waits for ~4 others' chunks first).
    max_waiting: int = Field(default=8, ge=1)
    # HTTP Retry-After, and how long degraded lasts after the last slow miss: then uncached
    # speech is tried again, and one more slow miss degrades at once (a circuit breaker).
    retry_after_s: int = Field(default=2, ge=1)
    fallback_text: str | None = "Sorry, I'm a little busy right now. Please try again in a moment."


class TtsConfig(BaseModel):
    output_sample_rate: int = 16_000
    max_chunk_ms: int = 200  # audio is sent in chunks of at most this length
    # The first chunk of a reply is at most this long (time to first audio); later chunks
    # grow with the audio already sent, up to max_chunk_ms (pipeline/chunking.py).
    # Set it to max_chunk_ms for fixed-size chunks.
    first_chunk_ms: int = Field(default=80, ge=10)
    degrade: DegradeConfig = DegradeConfig()


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/voxserve, else ~/.cache/voxserve (read when the cache opens)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxserve"


class CacheConfig(BaseModel):
    """The TTS cache: finished replies by text, voice, speed, rate and engine version, held
    in memory (hits never touch disk) and in sqlite on local disk (restarts keep it)."""

    enabled: bool = True
    dir: Path | None = None  # None: default_cache_dir(); `voxserve serve --cache-dir DIR`
    # Bound on the audio held, in memory and on disk alike. 256 MiB is ~2.3 h of 16 kHz
    # audio, some 3,000 sentences of 3 s: room for the hot replies of most services.
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    max_entry_bytes: int = Field(default=4 * 1024 * 1024, ge=0)  # ~2 min at 16 kHz: longer not kept
    ttl_s: float = Field(default=7 * 24 * 3600, gt=0)
    jitter: float = Field(default=0.2, ge=0, lt=1)  # each TTL is ttl_s x (1 +- jitter), at random
    prewarm_file: Path | None = None  # sentences, one a line, cached at start-up
    # Disk writes waiting for the writer thread; beyond this, new entries stay in memory
    # only (counted as disk_dropped) rather than letting the backlog grow.
    write_queue_bytes: int = Field(default=32 * 1024 * 1024, ge=0)

    def path(self) -> Path:
        return Path(self.dir or default_cache_dir()) / "tts-cache.sqlite3"


class LimitsConfig(BaseModel):
    max_sessions: int = 500
    max_text_chars: int = 4_000
    max_message_bytes: int = 256 * 1024
    max_frame_ms: int = 200  # one binary message may carry up to 10 frames of audio
    max_upload_bytes: int = 25 * 1024 * 1024
    # Time between a WebSocket/gRPC connect and its session.start (slow-loris guard).
    handshake_timeout_s: float = Field(default=10.0, gt=0)
    # WebSocket: a client silent this long is ended (`idle_timeout`); no session outlives
    # max_session_s (`session_expired`). Both fatal, after `session.ended`.
    idle_timeout_s: float = Field(default=300.0, gt=0)
    max_session_s: float = Field(default=4 * 3600.0, gt=0)


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
    cache: CacheConfig = CacheConfig()
    limits: LimitsConfig = LimitsConfig()
    # Bearer key for /admin routes (VOXSERVE_ADMIN_KEY); unset, they answer 403.
    admin_key: SecretStr | None = None
    # API keys for every transport (README "Authentication"): plain, or `sha256:<hex>` of
    # the key. VOXSERVE_API_KEYS takes them comma-separated. None configured: auth is off,
    # allowed on a loopback host only unless insecure_no_auth (`--insecure-no-auth`).
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    api_keys_file: Path | None = None  # one key a line, plain or sha256:<hex>; # comments
    insecure_no_auth: bool = False
    # Origins (scheme://host[:port]) allowed to call HTTP routes from a browser (CORS) and
    # to open the WebSocket; the server's own page is always allowed. Empty: closed.
    cors_allowed_origins: list[str] = Field(default_factory=list)
    # The gRPC (voxserve.v1) and Wyoming transports: own ports on `host`, served by the
    # same process and event loop as HTTP; 0 disables either. They need the `grpc` extra.
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    wyoming_port: int = Field(default=10300, ge=0, le=65535)
    # TLS for HTTP/WebSocket and gRPC alike (PEM files); both set or neither. Wyoming stays
    # plain TCP (Home Assistant's client does not speak TLS).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Observability (README "Observability"). metrics_enabled=false turns the per-session
    # and per-stage latency observations off (to measure their cost; counters stay on).
    metrics_enabled: bool = True
    # Latencies per stage kept for GET /debug/stats and `voxserve stats` (P50/P99).
    profile_window: int = Field(default=2048, ge=1)
    # The event loop watchdog logs the loop's stack when it did not run for this long;
    # 0 turns the watchdog off.
    loop_stall_ms: float = Field(default=100.0, ge=0)
    # Log level per logger, e.g. {"voxserve.pipeline" = "debug"} (`--log-module`).
    log_modules: dict[str, str] = Field(default_factory=dict)
    # OpenTelemetry spans per turn (VAD, ASR, responder, TTS); needs the `otel` extra and
    # the standard OTEL_* env vars for the exporter. Off: nothing is imported.
    otel_enabled: bool = False

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        """VOXSERVE_API_KEYS=k1,k2 (a string) as a list; a list is taken as it is."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

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
