"""The `cosyvoice` TTS engine: voxserve in front of CosyVoice's own runtimes.

`url` picks the transport: `grpc://HOST:PORT` (runtime/python/grpc, engines/cosyvoice_grpc.py)
or `http://HOST:PORT` (runtime/python/fastapi, engines/cosyvoice_http.py); without a url the
model runs in-process when the `cosyvoice` package is importable and `model_dir` (a local
directory) or `model` (an official id, fetched on first use: engines/cosyvoice_models.py) is
set (engines/cosyvoice_local.py). Voices: the `voices` table and the zero-shot voices registered
through the admin API (engines/cosyvoice_voices.py).

Each call is one bounded piece of the text (a sentence, cut at `max_piece_chars`), so a
cancelled request stops after the piece in progress and a long text never becomes one
unbounded remote call; audio is yielded as it arrives, so the first chunk reaches the
pipeline as soon as CosyVoice yields it. Calls in flight are bounded by a credit window
(engines/credits.py, the edge-to-core link's AIMD window): a stall shrinks it, successes
grow it back to `max_concurrency`, and a call that finds it full for `credit_wait_ms` is
refused as `overloaded`. A runtime that is down, dies mid-stream or sends nothing for
`timeout_s` fails only that call, with a clear error; the next call reconnects.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from voxserve.audio.pcm import Int16Array
from voxserve.config import ClusterCredits, default_cache_dir
from voxserve.engines import cosyvoice_local, cosyvoice_models
from voxserve.engines._versions import dist_version
from voxserve.engines.base import PromptRules
from voxserve.engines.chunk_deadline import ChunkLate
from voxserve.engines.cosyvoice_request import (
    PROMPT_RATE,
    CosyBusy,
    CosyFailed,
    CosyRequest,
    CosyTransport,
    CosyUnavailable,
)
from voxserve.engines.cosyvoice_voices import (
    DEFAULT_LANGUAGE,
    ENGINE,
    MAX_PROMPT_S,
    MIN_PROMPT_S,
    CosyVoiceEntry,
    ZeroShotStore,
    check_voice_id,
    parse_table,
)
from voxserve.engines.credits import TierCredits
from voxserve.engines.registry import EngineConfigError
from voxserve.errors import ErrorCode, VoxError
from voxserve.text import MAX_PIECE_CHARS, bounded_pieces
from voxserve.types import EngineInfo, Voice

DEFAULT_SAMPLE_RATE = 24_000  # CosyVoice2/3; CosyVoice-300M is 22050
SCHEMES = ("grpc", "http", "https")
MIN_SPEED = 0.25
MAX_SPEED = 4.0
NOT_INSTALLED = (
    "set url (grpc://HOST:PORT or http://HOST:PORT: a CosyVoice runtime); "
    "in-process synthesis needs the cosyvoice package, which is not installed"
)
KINDS: dict[str, type | tuple[type, ...]] = {"integer": int, "number": (int, float), "string": str}


class CosyVoiceTts:
    """TtsEngine over one CosyVoice runtime (or the model in-process)."""

    fork_safe = False  # a gRPC channel must be made in the process that uses it
    # VoiceRegistration (engines/base.py): the zero-shot voices of the admin API.
    prompt_rules = PromptRules(
        rate=PROMPT_RATE, min_s=MIN_PROMPT_S, max_s=MAX_PROMPT_S, default_language=DEFAULT_LANGUAGE
    )

    def __init__(
        self,
        *,
        url: str | None = None,
        sample_rate: int | None = None,
        voices: dict[str, Any] | None = None,
        timeout_s: float = 10.0,
        max_concurrency: int = 8,
        credit_wait_ms: int = 250,
        device: str = "auto",
        model_dir: str | None = None,
        model: str | None = None,
        source: str = "huggingface",
        voice_dir: str | None = None,
        max_piece_chars: int = MAX_PIECE_CHARS,
        threads: int = 1,  # the runtime passes it to every engine; the work is remote
    ) -> None:
        _check_types(
            url=(url, "string"),
            sample_rate=(sample_rate, "integer"),
            timeout_s=(timeout_s, "number"),
            max_concurrency=(max_concurrency, "integer"),
            credit_wait_ms=(credit_wait_ms, "integer"),
            device=(device, "string"),
            model_dir=(model_dir, "string"),
            model=(model, "string"),
            source=(source, "string"),
            voice_dir=(voice_dir, "string"),
            max_piece_chars=(max_piece_chars, "integer"),
        )
        if timeout_s <= 0:
            raise _config("timeout_s must be > 0 (seconds for the first chunk and each next)")
        if max_concurrency < 1:
            raise _config("max_concurrency must be >= 1 (calls in flight to the runtime)")
        if credit_wait_ms < 0 or max_piece_chars < 1:
            raise _config("credit_wait_ms must be >= 0 and max_piece_chars >= 1")
        if sample_rate is not None and not 8_000 <= sample_rate <= 48_000:
            raise _config(
                f"sample_rate {sample_rate} is not a CosyVoice rate "
                "(22050 for CosyVoice-300M, 24000 for CosyVoice2/3)"
            )
        self.timeout_s = timeout_s
        self._max_piece_chars = max_piece_chars
        self.transport: CosyTransport
        if model is not None:
            model_dir = _fetched(model, source, url, model_dir)
        self.transport, self.sample_rate = _transport(
            url, sample_rate, timeout_s, max_concurrency, device, model_dir
        )
        self.credits = TierCredits(
            ENGINE,
            ClusterCredits(
                initial=max_concurrency, min=1, max=max_concurrency, wait_ms=credit_wait_ms
            ),
        )
        try:
            self._table = _table(voices or {}, self.sample_rate)
            if isinstance(self.transport, cosyvoice_local.LocalTransport):
                _check_speakers(self.transport, self._table)
        except BaseException:
            self.transport.close()  # its channel, client or model: a reload goes on without
            raise
        directory = Path(voice_dir) if voice_dir else default_cache_dir() / "cosyvoice-voices"
        self.store = ZeroShotStore(directory, self.sample_rate)
        self._registering = threading.Lock()  # admin calls on executor threads, one at a time
        self._prompted = {
            voice_id: entry
            for voice_id, entry in self.store.load().items()
            if voice_id not in self._table
        }
        self._entries = {**self._prompted, **self._table}
        local = isinstance(self.transport, cosyvoice_local.LocalTransport)
        self.info = EngineInfo(
            kind="tts",
            name=ENGINE,
            package="cosyvoice" if local else "cosyvoice runtime",
            version=dist_version("cosyvoice") if local else "remote",
            license="Apache-2.0 (CosyVoice code and models)",
            model=self.transport.where,
        )
        self.cache_fingerprint = f"cosyvoice at {self.transport.where}, {self.sample_rate} Hz"

    def voices(self) -> tuple[Voice, ...]:
        return tuple(entry.voice for entry in self._entries.values())

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[Int16Array]:
        """Checks now (cheap); the runtime is called at the first pull, one piece at a time."""
        entry = self._entries.get(voice)
        if entry is None:
            raise ValueError(f"unknown cosyvoice voice {voice!r}; valid: {sorted(self._entries)}")
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")
        if speed != 1.0 and not self.transport.speeds:
            raise ValueError(
                "CosyVoice's gRPC and HTTP runtimes take no speed; use speed 1.0 with this voice"
            )
        pieces = bounded_pieces(text, self._max_piece_chars)
        return self._generate(entry, pieces, speed)

    def _generate(
        self, entry: CosyVoiceEntry, pieces: list[str], speed: float
    ) -> Iterator[Int16Array]:
        for piece in pieces:
            yield from self._call(entry.request(piece, speed))

    def _call(self, request: CosyRequest) -> Iterator[Int16Array]:
        """One runtime call under a credit: its audio as it comes, whole samples only."""
        if not self.credits.acquire():
            raise self._busy()
        settled = False
        received = False
        carry = b""
        stream = self.transport.stream(request)
        try:
            for data in stream:
                received = True
                data = carry + data
                whole = len(data) - len(data) % 2
                carry = data[whole:]
                if whole:
                    yield np.frombuffer(data[:whole], dtype=np.int16).copy()
            settled = True
            self.credits.success()
        except ChunkLate:
            settled = True
            self.credits.missed()
            raise VoxError(
                ErrorCode.STAGE_TIMEOUT,
                f"the cosyvoice runtime at {self.transport.where} sent no audio for "
                f"{self.timeout_s:g} s; the call was cancelled",
                stage="tts",
            ) from None
        except CosyBusy as exc:
            settled = True
            self.credits.refused()
            raise self._busy(str(exc)) from None
        except CosyUnavailable as exc:
            raise VoxError(
                ErrorCode.ENGINE_ERROR,
                f"the cosyvoice runtime at {self.transport.where} is unreachable ({exc}); "
                "retry when it is back",
                stage="tts",
                retry_after_s=1,
            ) from None
        except CosyFailed as exc:
            hint = "" if received else _speaker_hint(request)
            raise VoxError(
                ErrorCode.ENGINE_ERROR,
                f"the cosyvoice runtime at {self.transport.where} failed the call ({exc}){hint}",
                stage="tts",
            ) from None
        finally:
            if not settled:
                self.credits.release()
            close = getattr(stream, "close", None)
            if callable(close):
                close()

    def _busy(self, why: str = "") -> VoxError:
        detail = f" ({why})" if why else ""
        return VoxError(
            ErrorCode.OVERLOADED,
            f"the cosyvoice runtime at {self.transport.where} is at capacity{detail}; "
            "retry shortly",
            stage="tts",
            retry_after_s=1,
        )

    def registered_voices(self) -> tuple[Voice, ...]:
        return tuple(entry.voice for entry in self._prompted.values())

    def register_voice(
        self,
        voice_id: str,
        pcm16k: Int16Array,
        prompt_text: str,
        language: str,
        description: str = "",
    ) -> Voice:
        """Register (or replace) a zero-shot voice (cross-lingual without `prompt_text`) and
        keep it on disk. ValueError for a bad id or one the `voices` table owns."""
        check_voice_id(voice_id)
        if voice_id in self._table:
            raise ValueError(f"voice {voice_id!r} is in the engine's voices table; pick another id")
        with self._registering:
            entry = self.store.add(voice_id, pcm16k, prompt_text, language, description)
            # Readers on executor threads see the old or the new dict, never one half-made.
            self._prompted = {**self._prompted, voice_id: entry}
            self._entries = {**self._prompted, **self._table}
        return entry.voice

    def unregister_voice(self, voice_id: str) -> bool:
        """Forget a registered voice and delete its files; False if there was none."""
        with self._registering:
            if voice_id not in self._prompted:
                return False
            self.store.remove(voice_id)
            self._prompted = {k: v for k, v in self._prompted.items() if k != voice_id}
            self._entries = {**self._prompted, **self._table}
        return True

    def close(self) -> None:
        self.transport.close()


def _config(message: str) -> EngineConfigError:
    return EngineConfigError("tts", ENGINE, message)


def _speaker_hint(request: CosyRequest) -> str:
    """The usual cause of a built-in speaker's call failing before any audio: the runtime's
    model lacks the spk_id (its frontend raises KeyError), which the protocols cannot ask."""
    if request.kind not in ("sft", "instruct"):
        return ""
    return (
        f"; check that spk_id {request.spk_id!r} is a speaker of the runtime's model "
        "(CosyVoice2/3 have no built-in speakers: use CosyVoice-300M-SFT, or zero-shot voices)"
    )


def _check_types(**options: tuple[object, str]) -> None:
    """Each option's value against its kind ("integer", "number", "string"): JSON and TOML
    give strings or booleans where a number was meant, and a wrong one must be one line
    naming the option, not a TypeError traceback. None passes (the option is unset)."""
    for name, (value, kind) in options.items():
        types = KINDS[kind]
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            article = "an" if kind == "integer" else "a"
            raise _config(f"{name} must be {article} {kind}, got {value!r}")


def _table(voices: dict[str, Any], sample_rate: int) -> dict[str, CosyVoiceEntry]:
    try:
        return parse_table(voices, sample_rate)
    except ValueError as exc:
        raise _config(str(exc)) from None


def _check_speakers(
    local: cosyvoice_local.LocalTransport, table: dict[str, CosyVoiceEntry]
) -> None:
    """In-process the model is known at start: a table voice it cannot speak is a config
    error now, not a failure at every request (CosyVoice2/3 have no built-in speakers and
    no `inference_instruct`; a runtime's model cannot be asked, so this is in-process only)."""
    speakers = set(local.speakers())
    for voice_id, entry in table.items():
        if entry.kind == "instruct" and local.model_name != "CosyVoice":
            raise _config(
                f"voices[{voice_id!r}] has instruct, which needs CosyVoice-300M-Instruct; "
                f"the model is {local.model_name}"
            )
        if entry.spk_id not in speakers:
            have = ", ".join(sorted(speakers)) or "none (use zero-shot voices)"
            raise _config(
                f"voices[{voice_id!r}]: spk_id {entry.spk_id!r} is not a speaker of the "
                f"model ({local.model_name}); its speakers: {have}"
            )


def _fetched(model: str, source: str, url: str | None, model_dir: str | None) -> str:
    """The snapshot directory of the official model `model` (engines/cosyvoice_models.py),
    fetched on first use; refused before any download when it could not be loaded."""
    if url:
        raise _config(
            "model is for in-process CosyVoice; a runtime at url loads its own (its --model_dir)"
        )
    if model_dir:
        raise _config("set model (an official id) or model_dir (a local directory), not both")
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())  # a local directory named as `model`
    try:
        cosyvoice_models.cosyvoice_model(model)
        if source not in cosyvoice_models.SOURCES:
            raise ValueError(
                f"source must be one of {', '.join(cosyvoice_models.SOURCES)}, got {source!r}"
            )
        if not cosyvoice_local.available():  # no download that nothing could load
            raise ValueError(NOT_INSTALLED)
        return str(cosyvoice_models.fetch_model(model, source=source))
    except (ValueError, LookupError, RuntimeError, OSError) as exc:
        raise _config(str(exc)) from None


def _transport(
    url: str | None,
    sample_rate: int | None,
    timeout_s: float,
    max_concurrency: int,
    device: str,
    model_dir: str | None,
) -> tuple[CosyTransport, int]:
    """The transport `url` names (or the in-process model) and the audio's sample rate."""
    if url:
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise _config(
                f"url {url!r} is not grpc://HOST:PORT or http(s)://HOST:PORT "
                "(a CosyVoice gRPC or FastAPI runtime)"
            )
        if model_dir:
            raise _config("set url (a CosyVoice runtime) or model_dir (in-process), not both")
        rate = sample_rate or DEFAULT_SAMPLE_RATE
        if parts.scheme == "grpc":
            if parts.port is None:
                raise _config(f"url {url!r} needs a port (CosyVoice's gRPC runtime: 50000)")
            from voxserve.engines.cosyvoice_grpc import GrpcTransport

            return GrpcTransport(f"{parts.hostname}:{parts.port}", timeout_s), rate
        from voxserve.engines.cosyvoice_http import HttpTransport

        return HttpTransport(url, timeout_s, max_concurrency), rate
    if not cosyvoice_local.available():
        raise _config(NOT_INSTALLED)
    if not model_dir:
        raise _config(
            "in-process CosyVoice needs model_dir (a CosyVoice model directory) or model "
            f"(an official id: {', '.join(cosyvoice_models.MODELS)})"
        )
    try:
        local = cosyvoice_local.LocalTransport(model_dir, device)
    except (ImportError, ValueError, OSError) as exc:
        raise _config(f"in-process CosyVoice failed to load: {exc}") from None
    if sample_rate is not None and sample_rate != local.sample_rate:
        raise _config(
            f"sample_rate {sample_rate} but the model at {model_dir} makes {local.sample_rate}"
        )
    return local, local.sample_rate
