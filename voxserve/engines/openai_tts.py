"""TTS by a remote OpenAI-compatible server (OpenAI, Kokoro-FastAPI, speaches, another
voxserve): `POST /audio/speech` with `response_format=pcm`, OpenAI's published raw format
(24 kHz mono 16-bit little-endian), read as it arrives and yielded chunk by chunk, so the
first audio reaches the pipeline (and the client) while the remote is still speaking.

`voices` maps voxserve voice ids to the remote's voice names (and their languages), so a
front server offers its own names over whichever remote voices it is given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import numpy as np

from voxserve.engines.base import Int16Array
from voxserve.engines.openai_remote import OpenAIEngine
from voxserve.engines.registry import EngineConfigError
from voxserve.engines.remote_audio import StreamedBody
from voxserve.errors import ErrorCode, VoxError
from voxserve.types import Voice

PCM_RATE = 24_000
"""OpenAI's `pcm` speech: 24 kHz, 16-bit signed little-endian, mono."""
MIN_SPEED = 0.25
MAX_SPEED = 4.0
FIRST_CHUNK_S = 0.3  # seconds of audio: chunk sizes, see OpenAITts._stream
MAX_FIRST_CHUNK_S = 2.5
NEXT_CHUNK_S = 0.5
MAX_CHUNK_S = 5.0
CHUNK_MARGIN_S = 0.3  # the playout margin (0.1 s) and the hops to the event loop
# Bounds on a remote's body (engines/remote_audio.py): read at most this far ahead of
# playback (the remote waits), and at most this much audio per character (speech is about
# 0.07 s a character at speed 1; a slower speed allows proportionally more) plus a margin:
# a remote that streams without end is cut off with an error.
MAX_AHEAD_S = 60.0
MAX_S_PER_CHAR = 1.0
MAX_EXTRA_S = 30.0
DEFAULT_VOICES: dict[str, Any] = {"alloy": {"voice": "alloy", "language": "en"}}


class OpenAITts(OpenAIEngine):
    """TtsEngine streaming from `POST {base_url}/audio/speech`.

    `voices`: {voxserve id: remote name} or {voxserve id: {"voice": remote name,
    "language": code, "description": text}} (language "en" when not given). `device` is
    accepted for the config shape of the local engines: the remote server chooses its own.
    """

    sample_rate = PCM_RATE

    def __init__(
        self,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        model: str = "tts-1",
        voices: Mapping[str, Any] | None = None,
        timeout_s: float = 30.0,
        max_concurrency: int = 8,
        device: str = "remote",
        threads: int = 1,
    ) -> None:
        self._voices, self._remote_names = _voice_table(
            DEFAULT_VOICES if voices is None else voices
        )
        super().__init__("tts", base_url, api_key, model, timeout_s, max_concurrency, device)
        # The cache keys of this engine's audio: which remote and which of its voices.
        self.cache_fingerprint = json.dumps(
            [self.remote.base_url, model, self._remote_names], sort_keys=True
        )

    def voices(self) -> tuple[Voice, ...]:
        return self._voices

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[Int16Array]:
        remote_voice = self._remote_names.get(voice)
        if remote_voice is None:
            valid = ", ".join(sorted(self._remote_names))
            raise ValueError(f"unknown voice {voice!r}; the openai engine has {valid}")
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}")
        body = {
            "model": self.model,
            "input": text,
            "voice": remote_voice,
            "response_format": "pcm",
            "speed": speed,
        }
        return self._stream(body, MAX_EXTRA_S + MAX_S_PER_CHAR * len(text) / speed)

    def _stream(self, body: dict[str, Any], max_s: float) -> Iterator[Int16Array]:
        """The remote's PCM, read as it arrives (engines/remote_audio.py) and handed on in
        chunks: the first once it holds at least the time it took to come plus a margin
        (FIRST_CHUNK_S .. MAX_FIRST_CHUNK_S of audio), so the next is not due before it is
        asked for; later ones all that came meanwhile (at least NEXT_CHUNK_S, at most
        MAX_CHUNK_S). Closing the generator (a cancelled reply) stops the reading."""
        remote = self.remote

        def check(response: httpx.Response) -> None:
            if response.status_code >= 400:
                response.read()
                raise remote.refused(response)
            if not _may_be_audio(response):  # an HTML error page or JSON under a 200
                raise VoxError(
                    ErrorCode.ENGINE_ERROR,
                    f"remote tts server at {remote.base_url} answered "
                    f"{response.headers.get('content-type')!r}, not pcm audio",
                    stage="tts",
                )

        def too_long() -> VoxError:
            return VoxError(
                ErrorCode.ENGINE_ERROR,
                f"remote tts server at {remote.base_url} sent more than {max_s:g} s of audio "
                f"for {len(body['input'])} characters; cut off",
                stage="tts",
            )

        body_stream = StreamedBody(
            lambda: remote.client.stream("POST", remote.url("audio/speech"), json=body),
            check,
            remote.failed,
            max_ahead=_bytes_for(MAX_AHEAD_S),
            max_total=_bytes_for(max_s),
            too_long=too_long,
        )

        def first_size() -> int:
            waited = time.monotonic() - body_stream.started + CHUNK_MARGIN_S
            return _bytes_for(min(max(FIRST_CHUNK_S, waited), MAX_FIRST_CHUNK_S))

        least = first_size
        try:
            while (data := body_stream.take(least, _bytes_for(MAX_CHUNK_S))) is not None:
                yield np.frombuffer(data, dtype="<i2").astype(np.int16)
                least = _next_size
        finally:
            body_stream.close()


def _may_be_audio(response: httpx.Response) -> bool:
    """False for a body that is text (HTML, JSON, XML): played as PCM it was noise under a
    200, and its few bytes made the stage's chunks late, so admission shed all new work."""
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    return not (kind.startswith("text/") or kind.endswith(("json", "xml")))


def _bytes_for(seconds: float) -> int:
    return int(seconds * PCM_RATE) * 2


def _next_size() -> int:
    return _bytes_for(NEXT_CHUNK_S)


def _voice_table(table: Mapping[str, Any]) -> tuple[tuple[Voice, ...], dict[str, str]]:
    """The voices offered and each id's remote name, or EngineConfigError saying why not."""

    def bad(message: str) -> EngineConfigError:
        return EngineConfigError("tts", "openai", f"option 'voices': {message}")

    if not isinstance(table, Mapping) or not table:
        raise bad('give a table {"voxserve id": "remote voice name", ...}')
    voices: list[Voice] = []
    names: dict[str, str] = {}
    for voice_id, entry in table.items():
        if isinstance(entry, str):
            entry = {"voice": entry}
        if not isinstance(entry, Mapping):
            raise bad(f"{voice_id!r} must map to a remote voice name or a table")
        unknown = sorted(set(entry) - {"voice", "language", "description"})
        if unknown:
            raise bad(
                f"{voice_id!r} has unknown key {', '.join(map(repr, unknown))}; "
                "valid keys: voice, language, description"
            )
        remote = entry.get("voice")
        language = entry.get("language", "en")
        if not isinstance(remote, str) or not remote:
            raise bad(f"{voice_id!r} needs 'voice': the remote voice name")
        if not isinstance(language, str) or not language:
            raise bad(f"{voice_id!r}: 'language' must be a language code such as 'en'")
        description = str(entry.get("description") or f"remote voice {remote}")
        voices.append(Voice(voice_id, "openai", language, PCM_RATE, description))
        names[voice_id] = remote
    return tuple(voices), names
