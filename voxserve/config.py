"""Server settings: defaults, then a TOML/JSON config file, then `VOXSERVE_*` env vars.

Nested keys use a double underscore in env vars: ``VOXSERVE_LIMITS__MAX_SESSIONS=200``.
Every bound written here is a decision; docs/architecture.md says why each default is what it is.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict


class Section(BaseModel):
    """A settings table: a key it does not have is an error, not a silent default
    (`[limits] max_sesions = 5` was ignored)."""

    model_config = ConfigDict(extra="forbid")


class EngineSpec(Section):
    """One engine: its registry name and the keyword options its constructor takes."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class EnginesConfig(Section):
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


class ExecutorConfig(Section):
    min_workers: int = 2
    max_workers: int = 8
    idle_release_s: float = 30.0


class StageConfig(Section):
    """Concurrency (shared by all sessions) and timeout of one engine stage."""

    concurrency: int = Field(ge=1)
    timeout_s: float
    # Slots bulk work (upload windows, one-shot HTTP/gRPC/Wyoming synthesis, prewarm) may
    # hold at once, so live sessions always find the rest free (pipeline/scheduling/stage.py). None:
    # concurrency - 1 (at least 1); set it to concurrency to let bulk use every slot.
    bulk_slots: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _bulk_within_concurrency(self) -> StageConfig:
        if self.bulk_slots is not None and self.bulk_slots > self.concurrency:
            raise ValueError(f"bulk_slots must be at most concurrency ({self.concurrency})")
        return self


class PipelineConfig(Section):
    executor: ExecutorConfig = ExecutorConfig()
    vad: StageConfig = StageConfig(concurrency=2, timeout_s=2.0)
    asr: StageConfig = StageConfig(concurrency=2, timeout_s=15.0)
    responder: StageConfig = StageConfig(concurrency=16, timeout_s=20.0)
    tts: StageConfig = StageConfig(concurrency=2, timeout_s=15.0)  # per chunk
    # 256 frames x 20 ms = 5.12 s of audio buffered between receiver and pipeline.
    ring_frames: int = 256
    # "wait": the receiver stops reading (TCP pushes back on the client);
    # "drop_oldest": oldest unprocessed audio is dropped and counted in session.ended.
    ring_full_policy: Literal["wait", "drop_oldest"] = "wait"
    dedup_window_ms: int = 500
    # VAD work of all sessions is gathered for up to this long and run as one executor call
    # (one batched model call per window step): hops cost more than silero's windows.
    vad_batch_wait_ms: float = 8.0
    # VAD windows (32 ms each) a stream gathers before its listener wakes: one wake-up, one
    # VAD request per batch. 2 (64 ms) keeps turn detection quick; 4 (128 ms) cuts the
    # server's CPU per frame ~10% at +64 ms on VAD decisions (docs/benchmarks.md).
    vad_batch_windows: int = Field(default=2, ge=1, le=8)
    # ... while a turn is in progress in a session that answers it (assistant mode, Realtime
    # responses), where the turn's end starts the reply: 1 judges every window as it comes
    # (the pause decode starts up to 32 ms sooner: assistant turn P50 379-406 ms against
    # 412-437, three runs each, docs/benchmarks.md "Turn-taking"), for more VAD rounds while
    # they speak (60 assistant streams on the load engines: server CPU 24% against 20-22%).
    # 2 gives the old behaviour. Not above vad_batch_windows.
    vad_turn_windows: int = Field(default=1, ge=1, le=8)
    vad_max_batch: int = 64
    # Calls of engines that allow it (`inline_safe`: silero, the load engines) run on the
    # event loop, not a worker thread, while they measure (smoothed) under this: a thread
    # hop costs more than such a call (pipeline/scheduling/stage.py). 0: every call takes a thread.
    inline_below_us: float = Field(default=500.0, ge=0)
    # Finals of different sessions run as one Whisper batch (utterances sharing an encoder
    # window encode together; results equal one at a time): those that end while Whisper is
    # busy are held for its next batch, and an idle Whisper waits up to asr_batch_wait_ms,
    # within the final's deadline, when the arrival rate says another final comes by then
    # (pipeline/scheduling/batcher.py). 0 runs a final on an idle Whisper at once.
    asr_batch_enabled: bool = True
    asr_batch_wait_ms: float = Field(default=250.0, ge=0)
    # ... but only while Whisper was busy at least this share of the last ~2 s: below that
    # a wait would add latency to buy engine time nobody needs. 0 gathers at any load.
    asr_batch_gather_busy: float = Field(default=0.8, ge=0, le=1)
    asr_max_batch: int = 4  # CPU per utterance: 134 ms alone, 95-100 at 4, 120 at 8
    # Earliest-deadline-first admission to engine stages (pipeline/scheduling/stage.py); False
    # admits in arrival order (FIFO), which exists to measure what EDF buys (docs/benchmarks.md).
    edf: bool = True
    # Turn outputs (events, audio chunks) queued per session before the pipeline waits
    # for the socket: bounded so a stalled client cannot grow server memory.
    outbox_messages: int = 256
    # Ring buffers in the process-wide pool (audio/pool.py). None: the sizing rule,
    # limits.max_sessions x 1.2 (one ring per stream, 20% headroom). Unused buffers cost
    # address space only; an empty pool falls back to plain allocation with a WARNING.
    pool_buffers: int | None = Field(default=None, ge=0)


class GcConfig(Section):
    """Garbage collector control (observe/gc_control.py; measured in docs/benchmarks.md)."""

    # gc.freeze() after the models load: collections skip the loaded objects, forked
    # workers keep their pages shared.
    freeze_after_load: bool = True
    # gc.set_threshold(gen0, gen1, gen2); None keeps Python's (700, 10, 10).
    thresholds: tuple[int, int, int] | None = (10_000, 20, 20)


class VadConfig(Section):
    threshold: float = 0.5
    neg_threshold: float = 0.35
    min_speech_ms: int = 200
    hangover_ms: int = 500  # silence that ends an utterance
    pad_ms: int = 200  # audio kept before speech start and after speech end
    max_utterance_s: float = 25.0  # force an end so one utterance cannot grow unbounded
    # /v1/stream and gRPC sessions that name none: semantic_vad (the silence that ends a
    # turn adapts to what was said, pipeline/turns/endpointing.py) or server_vad (hangover_ms).
    turn_detection: Literal["server_vad", "semantic_vad"] = "semantic_vad"
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    # A tentative end: after this much silence the final is decoded (and, assistant mode,
    # the reply made, held back) before the turn is confirmed; 0: no speculation. 32 ms (one
    # VAD window): a complete sentence's turn ends when that decode is back, so starting it
    # sooner is what brings turn latency down (docs/benchmarks.md "Turn-taking"); a pause
    # that goes on costs the decode (voxserve_speculative_cancelled_total).
    speculate_ms: int = Field(default=32, ge=0, le=2000)
    # Audio after the VAD's end of speech that the decode at a tentative end is given.
    # Whisper writes a word into trailing silence ("a table for" + 120 ms of silence ->
    # "a table for it?", a question that ends the turn); the VAD's own lag (its end comes
    # 60-130 ms after the last audible sound) already holds the last word's tail.
    pause_tail_ms: int = Field(default=0, ge=0, le=2000)


class AsrConfig(Section):
    partials: bool = True
    partial_interval_ms: int = 640  # re-decode the growing utterance this often
    min_partial_ms: int = 480  # no partial until this much speech
    # Audio arriving faster than this many times real time gets no partial (a recording
    # sent at once, a backlog being caught up): it would be stale before it is sent, the
    # final is moments away, and each is a whole decode taken from that final's CPU. Live
    # clients send at 1x; tests and benches at up to 4x. 0: partials at any pace.
    partial_max_speed: float = Field(default=8.0, ge=0, le=1000)
    # Uploads (HTTP, Wyoming, `voxserve transcribe`) longer than this go through the VAD,
    # and their speech is packed into windows of at most this much audio (a region longer
    # than that cut at its quietest moments: pipeline/recognition/speech_windows.py, windows.py).
    # 7 s fills Whisper's 10 s encoder bucket to its 70% (engines/whisper_asr.py): a 10-minute
    # recording (352 s of speech) took 16.5 s of Whisper CPU in 7 s windows (batches of 4),
    # 22-25 s in 14 s ones (20 s bucket), 25 s in 28 s ones; WER 1.0%, 1.4%, 4.9%
    # (docs/benchmarks.md, issue 23).
    bulk_window_s: float = Field(default=7.0, ge=5.0, le=30.0)
    # The windows of every upload in flight are decoded together, as bulk batches of the
    # cross-session ASR batcher (pipeline/scheduling/asr_batch.py) of at most this much audio and
    # this many windows. Live finals keep their own slot and CTranslate2 replica whatever the
    # size; a batch is how long bulk holds its slot between turns, what a short upload
    # arriving behind a long one waits at most. Larger batches: less CPU per audio second.
    bulk_batch_s: float = Field(default=20.0, ge=5.0, le=600.0)
    bulk_max_batch: int = Field(default=8, ge=1, le=64)
    # A one-shot transcription's promise (uploads, Wyoming, `voxserve transcribe`): its
    # transcript within this long after its audio is in, plus one_shot_budget_per_audio
    # seconds per second of audio (a long recording is not late for being long). A request
    # predicted to miss it, or to make admitted work miss its own (the bulk work played in
    # deadline order at a batch cost fitted online: pipeline/recognition/bulk.py), is
    # refused at once with `overloaded` and a Retry-After of how late; one with nothing
    # ahead of it is always taken.
    # The stage timeout (pipeline.asr.timeout_s) plus the audio stays the hard limit.
    one_shot_budget_ms: int = Field(default=2000, ge=1)
    one_shot_budget_per_audio: float = Field(default=0.25, ge=0.0, le=10.0)


class DegradeConfig(Section):
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
    # A backstop only: at once when this many syntheses already wait for a TTS slot, so the
    # queue's memory stays bounded. Admission itself is by predicted lateness (below).
    max_waiting: int = Field(default=64, ge=1)
    # Admission by predicted lateness (pipeline/scheduling/tts_lateness.py): a synthesis is refused
    # (a live reply speaks the fallback phrase) only when its first audio, predicted from
    # the measured service rate and the work ahead of it in EDF order, would come later
    # than first_audio_budget_ms after it arrived. False: no prediction (counts only).
    predict: bool = True
    # The same deadline for a one-shot request (HTTP speech, gRPC Synthesize, Wyoming
    # `synthesize`): nobody is in a conversation, so a burst may queue longer than a live
    # reply would. 4000 ms holds a burst of 16 two-sentence requests on a 2-vCPU box
    # (piper joe-medium, both TTS slots: ~190 ms a first clause, 16 of them ~3 s; measured,
    # docs/benchmarks.md) and still refuses a sustained overload at once.
    one_shot_first_audio_budget_ms: int = Field(default=4000, ge=1)
    # A one-shot request is also refused when, admitted, it would make an admitted stream
    # pause: the engine could not keep every admitted stream playing at real time from its
    # deadline on (pipeline/scheduling/tts_lateness.py). False: admitted by first audio only,
    # which serves more requests under overload, each pausing between its clauses (right for
    # clients that download whole files; a player that plays as the audio comes hears gaps).
    continuity: bool = True
    # The service rate before any synthesis was measured: engine ms per character (piper
    # medium: ~1-3 ms on a 2-vCPU box). Then an EWMA per engine/voice, each finished
    # synthesis weighing `rate_smoothing`.
    ms_per_char: float = Field(default=2.0, gt=0)
    rate_smoothing: float = Field(default=0.2, gt=0, le=1)
    # HTTP Retry-After, and how long degraded lasts after the last slow miss: then uncached
    # speech is tried again, and one more slow miss degrades at once (a circuit breaker).
    retry_after_s: int = Field(default=2, ge=1)
    fallback_text: str | None = "Sorry, I'm a little busy right now. Please try again in a moment."


class TtsConfig(Section):
    output_sample_rate: int = 16_000
    max_chunk_ms: int = 200  # audio is sent in chunks of at most this length
    # The first chunk of a reply is at most this long (time to first audio); later chunks
    # grow with the audio already sent, up to max_chunk_ms (pipeline/synthesis/chunking.py).
    # Set it to max_chunk_ms for fixed-size chunks.
    first_chunk_ms: int = Field(default=80, ge=10)
    # Output pacing: audio is sent no further ahead of the client's playback (real-time
    # clock from the reply's first chunk) than this, so a reply never piles up in socket
    # buffers and a barge-in stops what the user hears within this much. Synthesis runs
    # ahead of the sending by up to max_ahead_ms (the server-side bound, per stream).
    pacing_lead_ms: int = Field(default=400, ge=0)
    max_ahead_ms: int = Field(default=6000, ge=200)
    degrade: DegradeConfig = DegradeConfig()
    # OpenAI voice name -> installed voice id, for every OpenAI-compatible route (speech,
    # Realtime, the aliases /v1/voices lists), e.g. {alloy = "joe", nova = "espeak-en"}.
    # A name not in the table keeps the built-in rule (server/session/openai_voices.py); an entry
    # naming a voice that is not installed stops `voxserve serve` at start.
    openai_voices: dict[str, str] = Field(default_factory=dict)


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/voxserve, else ~/.cache/voxserve (read when the cache opens)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxserve"


class CacheConfig(Section):
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
    # With API keys, each key is served only the entries its own requests made (plus the
    # operator's prewarmed and fallback phrases): otherwise one tenant could tell from a
    # reply's speed what another had synthesised. True shares every entry among all keys.
    share_across_keys: bool = False

    def path(self) -> Path:
        return Path(self.dir or default_cache_dir()) / "tts-cache.sqlite3"


class LimitsConfig(Section):
    max_sessions: int = 500
    max_text_chars: int = 4_000
    max_message_bytes: int = 256 * 1024
    # Nesting of arrays and objects in client JSON (control messages, HTTP bodies, Wyoming
    # events), checked before parsing: the parser recurses once per level, and ~1,000
    # levels (2 KB) would exhaust the interpreter's stack. The protocols need 3.
    max_json_depth: int = Field(default=32, ge=1, le=256)
    max_frame_ms: int = 200  # one binary message may carry up to 10 frames of audio
    max_upload_bytes: int = 25 * 1024 * 1024
    # Decoded audio that all uploads may hold at once (float32 at 16 kHz: 64 KB per second;
    # the default ~70 min). Each upload reserves its decode before it is made (the length its
    # header declares, then window by window); past this it waits up to 2 s, then 503
    # `overloaded`. No single upload may decode to more than this either (413).
    max_decoded_audio_bytes: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024)
    # Time between a WebSocket/gRPC connect and its session.start (slow-loris guard).
    handshake_timeout_s: float = Field(default=10.0, gt=0)
    # WebSocket: a client silent this long is ended (`idle_timeout`); no session outlives
    # max_session_s (`session_expired`). Both fatal, after `session.ended`.
    idle_timeout_s: float = Field(default=300.0, gt=0)
    max_session_s: float = Field(default=4 * 3600.0, gt=0)
    # A client that reads nothing for this long while output waits for it is ended
    # (`client_stalled`): a stalled reader never makes the server buffer without bound.
    stalled_client_s: float = Field(default=15.0, gt=0)
    # HTTP (slow-loris guards: uvicorn itself times out only the idle time between
    # requests). A request's headers must be complete this long after the connection
    # opened or the request's first byte arrived (408 `client_stalled`, then closed)...
    http_header_timeout_s: float = Field(default=10.0, gt=0)
    # ...and a request body (JSON or upload) may not pause longer than this between two
    # reads (408 `client_stalled`, then closed).
    http_body_timeout_s: float = Field(default=15.0, gt=0)
    # HTTP and WebSocket connections open at once. None: the descriptor limit
    # (RLIMIT_NOFILE) less a headroom for engines, cache files, logs and the other
    # transports (server/http/protocol.py `default_max_connections`), so clients can never
    # take the descriptors /healthz and the server itself need. At the cap the connection
    # idle or stuck in its request the longest is closed to make room; if none is, the new
    # one is refused (503 `overloaded`).
    max_connections: int | None = Field(default=None, ge=1)
    # SIGTERM: stop admitting, let live turns finish for up to this long, then end every
    # session with `session.ended` reason `server_shutdown`, then exit 0.
    drain_timeout_s: float = Field(default=20.0, ge=0)
    # A WebSocket client that drops without `session.end` may reconnect with
    # `session.resume` within this long and continue (0 = sessions end on disconnect).
    resume_window_s: float = Field(default=30.0, ge=0)
    # Memory guard (pipeline/scheduling/memory_guard.py): while this process's resident set is over
    # the smaller of these, new sessions, requests and syntheses are refused `overloaded`
    # (503 + Retry-After), so hostile or heavy input meets a refusal, not the OOM killer.
    # The fraction is of the container's memory limit (the machine's when there is none),
    # divided among `workers`; 0 turns either bound off.
    memory_guard_fraction: float = Field(default=0.85, ge=0, le=1)
    memory_guard_bytes: int = Field(default=0, ge=0)


class IceServer(Section):
    """A STUN or TURN server offered to ICE (as RTCIceServer): `urls` like
    `stun:stun.example.org:3478` or `turn:turn.example.org:3478?transport=udp`."""

    urls: list[str] = Field(min_length=1)
    username: str | None = None
    credential: SecretStr | None = None


class WebRtcConfig(Section):
    """WebRTC calls (POST /v1/realtime/calls, docs/webrtc.md): Opus over UDP through aiortc
    in this process, onto the same sessions, limits, quotas and metrics as every transport.
    Needs the `webrtc` extra (in the default set-up); without it the route answers 501."""

    enabled: bool = True
    # None: host candidates only (a LAN, or a host with a public address). Behind NAT add a
    # STUN server (server-reflexive candidates) and, for symmetric NAT, a TURN relay.
    ice_servers: list[IceServer] = Field(default_factory=list)
    # The UDP ports host candidates bind, both ends included (a firewall opens just these);
    # 0 and 0: any ephemeral port. A call needs one port; a full range refuses the call.
    port_min: int = Field(default=0, ge=0, le=65535)
    port_max: int = Field(default=0, ge=0, le=65535)
    # ICE and DTLS must complete this long after the answer, or the call is dropped.
    connect_timeout_s: float = Field(default=15.0, gt=0)
    # A call whose peer sends no RTP for this long has vanished (no BYE): it is ended and
    # freed. ICE consent (RFC 7675, ~30 s) ends it too when this is larger.
    media_timeout_s: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _port_range(self) -> WebRtcConfig:
        if (self.port_min == 0) != (self.port_max == 0) or self.port_min > self.port_max:
            raise ValueError(
                "webrtc.port_min and port_max: both 0 (any port) or 1 <= port_min <= port_max"
            )
        return self


class RealtimeConfig(Section):
    """Client secrets for the Realtime API (POST /v1/realtime/client_secrets): a browser page
    gets a short-lived, single-use key (`ek_...`) instead of the real one; the bound on a
    turn's tool calls."""

    # Lifetime when the request gives no `expires_after` (OpenAI's default, 10 minutes);
    # a request may ask for 10 s to 2 h.
    client_secret_ttl_s: int = Field(default=600, ge=10, le=7200)
    # Unused secrets held at once, server-wide; past it minting answers 429.
    max_client_secrets: int = Field(default=10_000, ge=1)
    # ...and per API key (with auth off every caller is the one anonymous tenant), so one
    # key cannot take every other key's secrets: its own 429 comes first.
    max_client_secrets_per_key: int = Field(default=1_000, ge=1)
    # A secret's session object as stored (compact JSON, unused fields dropped); a bigger
    # one is refused at mint (400 `session_too_large`). 16 KiB x 10,000: 160 MB of disk.
    max_client_secret_session_bytes: int = Field(default=16 * 1024, ge=256, le=1024 * 1024)
    # The store's directory (None: the cache directory, `--cache-dir`); every worker of
    # `serve --workers N` uses this one (server/realtime_api/secrets.py).
    secrets_dir: Path | None = None
    # Tool calls the responder may make for one user turn (from the user's last message,
    # over the responses that follow it): past it the response fails with
    # `too_many_tool_calls`, so a responder that keeps calling tools cannot loop forever.
    max_tool_calls_per_turn: int = Field(default=16, ge=1, le=1024)


class WyomingConfig(Section):
    """The Wyoming port's zeroconf record (server/wyoming/zeroconf.py): Home Assistant
    discovers the server by it. `serve --no-zeroconf` / `--zeroconf-name NAME`."""

    zeroconf: bool = True  # advertise `_wyoming._tcp.local.` while Wyoming is on
    # The DNS-SD instance name ("" = voxserve-<host name>): what Home Assistant lists.
    zeroconf_name: str = Field(default="", max_length=63)
    # Wyoming carries no key: its own share of the server, so anonymous connections can
    # never hold what keyed tenants need (server/wyoming/seats.py). Requests running at
    # once over every Wyoming connection (None: a quarter of limits.max_sessions, >= 1).
    max_sessions: int | None = Field(default=None, ge=1)
    # Connections open at once, in all (within the descriptors HTTP leaves) and from one
    # address (Home Assistant connects from its own for every satellite, 1-2 each); over
    # either: `wyoming_limit`, closed.
    max_connections: int = Field(default=64, ge=1)
    max_connections_per_peer: int = Field(default=32, ge=1)
    # Audio one transcription may send (and limits.max_upload_bytes): what a connection
    # buffers. A spoken command is seconds long.
    max_audio_s: float = Field(default=120.0, gt=0)

    @field_validator("zeroconf_name")
    @classmethod
    def _printable_name(cls, value: str) -> str:
        if len(value.encode()) > 63 or not value.isprintable() or "." in value:
            raise ValueError(
                "wyoming.zeroconf_name must be printable, without '.', 63 bytes at most"
            )
        return value


class FlowConfig(Section):
    """Credit windows (docs/protocol.md, `credit`) and admission by measured load.

    Every `tick_ms` each model stage is judged: under pressure when more than
    `queue_limit` calls wait for it (with `predict_lateness`, on a stage that predicts:
    when the live work held for it would start past its deadlines, at the batch cost
    fitted from its recent batches: ASR finals), when callers wait longer than
    `wait_limit_ms` for a slot (smoothed), or when a call timed out or started past its
    deadline since the last tick. Under pressure each stream's input window (VAD batches of
    audio in flight; default 8) halves, down to 1; without, it grows back by one a tick. New
    sessions are refused (`overloaded`, retry hint) once a spell of pressure on any stage
    (TTS only with `shed_tts`) has lasted `shed_after_s`; a spell ends after `calm_s`
    without pressure.
    """

    credit_window: int = Field(default=8, ge=1)
    tick_ms: int = Field(default=200, ge=10)
    queue_limit: int = Field(default=4, ge=0)
    wait_limit_ms: float = Field(default=500.0, gt=0)
    shed_after_s: float = Field(default=1.0, ge=0)
    calm_s: float = Field(default=2.0, ge=0)
    retry_after_s: int = Field(default=2, ge=1)
    # New live streams are refused while the ASR engine's busy share with finals plus the
    # learned share of each live stream that has not asked for a final yet (its cost does
    # not show before), the new one's included, would pass this
    # (pipeline/scheduling/session_demand.py: learned from 3 or more streams, and only
    # while the engine is at least half busy: an average learned from few streams
    # over-prices a burst whose finals batch together). 0: off.
    asr_busy_limit: float = Field(default=0.9, ge=0)
    # Under this busy share of the ASR engine the stream-cost rule refuses nothing: a burst
    # there is held by the queue's pressure alone (0: the rule judges at any load).
    asr_busy_floor: float = Field(default=0.5, ge=0, le=1)
    # Whether a stage that predicts the lateness of its held live work (ASR finals) is
    # judged by that prediction instead of `queue_limit` (false: the count, as before).
    predict_lateness: bool = True
    # Whether pressure on the TTS stage sheds new sessions and requests too. Off: TTS
    # admission is per synthesis, by predicted lateness (tts.degrade.predict), so a burst
    # the engine can serve in time is queued, not refused for the queue's length.
    shed_tts: bool = False


class QuotaLimits(Section):
    """Limits for one principal (an API key, or the anonymous caller). In `default`, None
    means no limit; in a per-key override, None means "as the default" and 0 no limit."""

    max_sessions: int | None = Field(default=None, ge=0)  # open at once, every transport
    requests_per_s: float | None = Field(default=None, ge=0)  # token bucket refill rate
    burst: int | None = Field(default=None, ge=0)  # bucket size; None: max(1, 2 x rate)
    audio_s_per_min: float | None = Field(default=None, ge=0)  # speech sent in, refilled per s


class QuotasConfig(Section):
    """Per-key quotas (docs/protocol.md "Quotas"), applied to every authenticated key, and
    to the anonymous caller while auth is off only when `anonymous` is true. Overrides in
    `keys` are by key id (`voxserve.server.session.auth.key_id`: 8 hex digits of the key's hash).
    Defaults: room for a busy client, a wall against one runaway key."""

    enabled: bool = True
    anonymous: bool = False
    default: QuotaLimits = QuotaLimits(
        max_sessions=64, requests_per_s=20.0, burst=40, audio_s_per_min=3_600.0
    )
    keys: dict[str, QuotaLimits] = Field(default_factory=dict)


class ClusterCredits(Section):
    """The gateway's window of in-flight calls per core tier (asr, tts): AIMD, like TCP's.
    A refusal (Ray Serve BackPressureError) or a deadline miss multiplies it by `decrease`;
    each success adds `increase / window` (about `increase` per window of calls)."""

    initial: int = Field(default=8, ge=1)
    min: int = Field(default=1, ge=1)
    max: int = Field(default=32, ge=1)
    increase: float = Field(default=1.0, gt=0)
    decrease: float = Field(default=0.5, gt=0, lt=1)
    # A call that finds the window full waits this long for a credit, then is refused
    # (`overloaded`; TTS: the fallback phrase), so the gateway never queues without bound.
    wait_ms: int = Field(default=250, ge=0)


class ClusterDeployment(Section):
    """One core tier's Ray Serve deployment (docs/cluster.md has the sizing rules)."""

    num_replicas: int = Field(default=1, ge=1)  # ignored when `autoscaling` is set
    num_cpus: float = Field(default=0.5, gt=0)  # per replica; fractional so it fits small hosts
    # GPUs per replica (fractional shares one GPU between replicas); > 0 also wants the
    # tier's engine on `device = "cuda"` (docs/engines.md), else the GPU sits idle.
    num_gpus: float = Field(default=0.0, ge=0)
    max_ongoing_requests: int = Field(default=4, ge=1)  # per replica, running at once
    max_queued_requests: int = Field(default=16, ge=-1)  # per gateway handle; -1 unbounded
    max_models_per_replica: int = Field(default=3, ge=1)  # voices / languages kept loaded
    max_replicas_per_node: int | None = Field(default=None, ge=1)
    # Ray Serve's autoscaling_config as it is (min_replicas, max_replicas,
    # target_ongoing_requests, upscale_delay_s, ...); None: a fixed num_replicas.
    autoscaling: dict[str, Any] | None = None


class ClusterConfig(Section):
    """Scale-out on Ray Serve (docs/cluster.md): the gateway's ASR and TTS engine calls go
    to core deployments (`voxserve cluster up`) instead of in-process engines."""

    enabled: bool = False  # `voxserve serve --cluster [ADDRESS]`
    address: str = "auto"  # Ray's address (host:port of the GCS, or "auto")
    namespace: str = "voxserve"
    app_name: str = "voxserve"
    # The Ray node on this host that a gateway or `cluster` command joins, by its address.
    # Needed only where one host runs several nodes (scripts/ray_nodes.sh): Ray's driver
    # otherwise picks the host's head node, whose address the others cannot answer.
    node_ip_address: str | None = None
    asr: ClusterDeployment = ClusterDeployment()
    tts: ClusterDeployment = ClusterDeployment()
    # ASR engine per language (the multiplexed model id); others use engines.asr.
    asr_languages: dict[str, EngineSpec] = Field(default_factory=dict)
    asr_timeout_s: float = Field(default=10.0, gt=0)  # one remote transcription
    tts_chunk_timeout_s: float = Field(default=5.0, gt=0)  # one remote audio chunk
    # A call that lost its replica (died, unreachable) is sent again this many times:
    # ASR whole, TTS from the first chunk not yet received.
    retries: int = Field(default=2, ge=0)
    credits: ClusterCredits = ClusterCredits()


class WakeConfig(Section):
    """Wake words (microWakeWord models of the `pymicro-wakeword` package): the Wyoming wake
    service and /v1/stream's `wake_word` (docs/protocol.md)."""

    enabled: bool = True  # load the models at start (needs the `wyoming` extra)
    # Model names as pymicro-wakeword's; an unknown one stops the server at start.
    models: list[str] = Field(
        default_factory=lambda: ["okay_nabu", "hey_jarvis", "hey_mycroft", "alexa"]
    )
    # Audio after a detection in which the same word is not reported again (one utterance
    # fires once; wyoming-microwakeword's --refractory-seconds default).
    refractory_s: float = Field(default=2.0, ge=0)
    # /v1/stream `wake_word`: after the word, a command must start within this much audio,
    # else ASR waits for the word again (as a voice assistant goes back to sleep).
    command_window_s: float = Field(default=8.0, gt=0)
    # Per model, overriding the model's own JSON (okay_nabu: 0.85 and 5 probabilities).
    probability_cutoff: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=dict)
    sliding_window_size: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)


class ModelSpec(Section):
    """One named model a request may choose (`[models.named.NAME]`): an engine and its
    options, like `engines.asr`. When the engine's constructor takes `model` (else `voice`)
    and `options` do not set it, the entry's name is given: `[models.named."small.en"]`
    alone is Whisper small.en."""

    kind: Literal["asr", "tts"] = "asr"
    engine: str | None = None  # None: whisper (asr), piper (tts)
    options: dict[str, Any] = Field(default_factory=dict)
    aliases: list[str] = Field(default_factory=list)  # other names a request may use

    def engine_name(self) -> str:
        return self.engine or ("whisper" if self.kind == "asr" else "piper")


class ModelsConfig(Section):
    """Models chosen per request by name (`model` on the OpenAI routes, Realtime's
    transcription model, /v1/stream's session.start): loaded on first use, kept while used,
    unloaded when idle `ttl` seconds or to stay within `max_loaded_bytes`. The defaults
    (`engines.asr`, `engines.tts`) are always loaded and count in neither bound."""

    # The default table: Whisper base (the `multilingual` extra, in `default`), so uploads'
    # translations work while live streams keep engines.asr (tiny.en). A table of one's own
    # replaces it.
    named: dict[str, ModelSpec] = Field(default_factory=lambda: {"base": ModelSpec()})
    # Seconds a named model stays loaded after its last use (speaches' `ttl`): -1 never
    # unloads it, 0 unloads it as soon as its last request or session ends.
    ttl: float = Field(default=300.0, ge=-1)
    # Memory the named models may hold together (each measured as the RSS its load added,
    # or its files' size when larger); the least recently used idle ones are unloaded to
    # make room. A model in use is never unloaded: the bound then holds once it is idle.
    # 0: no bound.
    max_loaded_bytes: int = Field(default=4 * 1024**3, ge=0)

    @field_validator("named")
    @classmethod
    def _names(cls, value: dict[str, ModelSpec]) -> dict[str, ModelSpec]:
        """A name or alias stands for one model: two entries claiming one would make a
        request's choice depend on the table's order."""
        seen: dict[str, str] = {}
        for name, spec in value.items():
            for label in (name, *spec.aliases):
                if not label.strip() or len(label) > 200:
                    raise ValueError(f"model name {label!r} must be 1-200 characters")
                if label in seen and not (label == name and seen[label] == name):
                    raise ValueError(f"model name {label!r} is used by {seen[label]!r} already")
                seen[label] = name
        return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="VOXSERVE_", env_nested_delimiter="__", extra="forbid"
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    engines: EnginesConfig = EnginesConfig()
    pipeline: PipelineConfig = PipelineConfig()
    vad: VadConfig = VadConfig()
    asr: AsrConfig = AsrConfig()
    tts: TtsConfig = TtsConfig()
    cache: CacheConfig = CacheConfig()
    limits: LimitsConfig = LimitsConfig()
    cluster: ClusterConfig = ClusterConfig()
    flow: FlowConfig = FlowConfig()
    quotas: QuotasConfig = QuotasConfig()
    gc: GcConfig = GcConfig()
    webrtc: WebRtcConfig = WebRtcConfig()
    realtime: RealtimeConfig = RealtimeConfig()
    wake: WakeConfig = WakeConfig()
    models: ModelsConfig = ModelsConfig()  # named models chosen per request
    # Never reach the Hugging Face Hub (`serve --offline`; HF_HUB_OFFLINE=1 too): a model
    # named by name must be in the cache already, else serve stops with the pull command.
    offline: bool = False
    # Server processes sharing the port (`serve --workers N`); engines that start no
    # threads are loaded once before fork and shared copy-on-write (server/workers.py).
    workers: int = Field(default=1, ge=1, le=64)
    # tracemalloc frames kept per allocation (`serve --tracemalloc N`); 0 = off. With it
    # on, GET /debug/tracemalloc diffs snapshots (leak hunting; slows the server).
    tracemalloc_frames: int = Field(default=0, ge=0, le=64)
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
    # Host names (besides loopback and `host`) a request's Host header may carry: the
    # DNS-rebinding defence (server/host_guard.py). `*.example.com`: its sub-domains; `*`:
    # any Host (the check off). VOXSERVE_ALLOWED_HOSTS takes them comma-separated.
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # The gRPC (voxserve.v1) and Wyoming transports: own ports on `host`, served by the
    # same process and event loop as HTTP; 0 disables either. They need the `grpc` extra.
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    wyoming_port: int = Field(default=10300, ge=0, le=65535)
    wyoming: WyomingConfig = WyomingConfig()  # its zeroconf record
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

    @field_validator("api_keys", "allowed_hosts", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        """VOXSERVE_API_KEYS=k1,k2 or VOXSERVE_ALLOWED_HOSTS=a.example,b.example (a string)
        as a list; a list is taken as it is."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("cors_allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        """A browser sends `Origin: scheme://host[:port]`, nothing after it: an entry with
        a path (or "null", which only `*` allows) would never match, silently."""
        for origin in value:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port] "
                    "(e.g. https://app.example.com), or * for any"
                )
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        return [host_entry(entry) for entry in value]

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


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+/?", re.IGNORECASE)
_HOST_NAME = re.compile(r"(\*\.)?[a-z0-9_-]{1,63}(\.[a-z0-9_-]{1,63})*")


def host_entry(entry: str) -> str:
    """One `allowed_hosts` entry as the Host check compares it: lower case, no trailing
    dot, an IP address in its short form without brackets. A scheme, port or path would
    never match a Host name, silently: refused."""
    value = entry.strip().lower()
    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        return ipaddress.ip_address(bare).compressed
    except ValueError:
        pass
    name = value.removesuffix(".")
    if value == "*" or (len(name) <= 253 and _HOST_NAME.fullmatch(name)):
        return name
    raise ValueError(
        f"{entry!r} is not a host name: write a name (voice.example.com), *.example.com for "
        "its sub-domains, an IP address, or * for any; no scheme, port or path"
    )


class ConfigError(ValueError):
    pass


def read_text_file(file: Path, what: str) -> str:
    """A settings file's text (`what`: "config file", "API keys file"), or a ConfigError
    naming it: unreadable (the OS's reason) or not UTF-8."""
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {file}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {file} is not UTF-8 text") from exc


def read_config_file(path: str | Path) -> dict[str, Any]:
    file = Path(path)
    text = read_text_file(file, "config file")
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


def with_updates(settings: Settings, **updates: Any) -> Settings:
    """A copy with top-level `updates` (command-line flags), each checked as the file and
    the environment are (ValidationError)."""
    settings = settings.model_copy()
    for name, value in updates.items():
        Settings.__pydantic_validator__.validate_assignment(settings, name, value)
    return settings


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Defaults < config file < VOXSERVE_* env vars < explicit overrides (CLI flags)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    data = read_config_file(path) if path else {}
    try:
        settings = Settings(**data)
        updates = {k: v for k, v in overrides.items() if v is not None}
        if updates:
            # Checked like the file and the environment (a --port over 65535 listened on
            # another port; --workers 500 forked 500), and still winning over both.
            settings = with_updates(settings, **updates)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            keys = ", ".join(_keys_of(first["loc"][:-1]))
            raise ConfigError(f"unknown setting {where}; valid keys there: {keys}") from exc
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"invalid setting {where}: {message}") from exc
    except SettingsError as exc:  # e.g. a VOXSERVE_* variable that must be JSON and is not
        raise ConfigError(f"invalid environment setting: {exc}") from exc
    return settings


def _keys_of(loc: tuple[int | str, ...]) -> list[str]:
    """The keys of the settings table at `loc` (list indexes skipped), for an unknown key's
    message."""
    model: type[BaseModel] = Settings
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(part, str) else None
        if field is None:
            continue
        found = [t for t in (field.annotation, *get_args(field.annotation)) if _is_model(t)]
        if found:
            model = found[0]
    return sorted(model.model_fields)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
