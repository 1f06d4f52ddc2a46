"""ASR by a remote OpenAI-compatible server (OpenAI, speaches, vLLM, another voxserve):
each utterance (or partial) is POSTed as a WAV to `/audio/transcriptions`.

voxserve keeps what it does in front (sessions, VAD, turn-taking, backpressure, metrics);
the remote only recognises. A remote failure is the call's VoxError
(`engine_unavailable` when it cannot be reached or is busy, `engine_error` when it refuses),
and the session carries on. Segments and words come back only when the remote's
`verbose_json` has them (`response_format`, or a call asking for word times).
"""

from __future__ import annotations

from typing import Any

import httpx

from voxserve.audio.pcm import to_int16
from voxserve.audio.wav import write_wav
from voxserve.engines.base import Float32Array
from voxserve.engines.openai_remote import OpenAIEngine
from voxserve.engines.registry import EngineConfigError
from voxserve.errors import ErrorCode, VoxError
from voxserve.types import SAMPLE_RATE, AsrOptions, AsrResult, Segment, Word

FORMATS = ("json", "verbose_json")


class OpenAIAsr(OpenAIEngine):
    """AsrEngine calling `POST {base_url}/audio/transcriptions`.

    `base_url` ends in `/v1` as the OpenAI SDK takes it; `api_key` (else $OPENAI_API_KEY)
    is sent as a Bearer token when there is one. `languages` are the ones sessions may ask
    for (the remote's model decides what it really knows). `device` is accepted for the
    config shape of the local engines: the remote server chooses its own."""

    inline_safe = False  # network I/O: never on the event loop

    def __init__(
        self,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        model: str = "whisper-1",
        languages: list[str] | tuple[str, ...] = ("en",),
        response_format: str = "json",
        timeout_s: float = 30.0,
        max_concurrency: int = 8,
        device: str = "remote",
        threads: int = 1,
    ) -> None:
        if response_format not in FORMATS:
            raise EngineConfigError(
                "asr",
                "openai",
                f"option 'response_format' {response_format!r} is not one of: {', '.join(FORMATS)}",
            )
        if not languages or not all(isinstance(code, str) and code for code in languages):
            raise EngineConfigError(
                "asr", "openai", "option 'languages' must be a list of language codes"
            )
        super().__init__("asr", base_url, api_key, model, timeout_s, max_concurrency, device)
        self.languages = tuple(languages)
        self.response_format = response_format

    def transcribe(
        self,
        audio: Float32Array,
        *,
        language: str | None = None,
        partial: bool = False,
        options: AsrOptions | None = None,
    ) -> AsrResult:
        options = options or AsrOptions()
        if options.task != "transcribe":
            raise ValueError("the openai ASR engine transcribes only (no translation)")
        if language is not None and language not in self.languages:
            raise ValueError(
                f"language {language!r} is not served; valid: {', '.join(self.languages)}"
            )
        verbose = self.response_format == "verbose_json" or options.word_timestamps
        form: dict[str, Any] = {
            "model": self.model,
            "response_format": "verbose_json" if verbose else "json",
        }
        if language is not None:
            form["language"] = language
        if options.prompt:
            form["prompt"] = options.prompt
        if options.temperature is not None:
            form["temperature"] = str(options.temperature)
        if options.word_timestamps:
            form["timestamp_granularities[]"] = ["segment", "word"]
        wav = write_wav(to_int16(audio), SAMPLE_RATE)
        try:
            response = self.remote.client.post(
                self.remote.url("audio/transcriptions"),
                data=form,
                files={"file": ("audio.wav", wav, "audio/wav")},
            )
        except httpx.HTTPError as exc:
            raise self.remote.failed(exc) from exc
        if response.status_code >= 400:
            raise self.remote.refused(response)
        return self._result(response, language)

    def _result(self, response: httpx.Response, language: str | None) -> AsrResult:
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise VoxError(
                ErrorCode.ENGINE_ERROR,
                f"remote asr server at {self.remote.base_url} sent no transcription JSON",
                stage="asr",
            )
        found = body.get("language")
        # verbose_json names the language ("english" at OpenAI, "en" elsewhere): a code
        # is taken, a name leaves the one asked for.
        code = found if isinstance(found, str) and len(found) == 2 else None
        return AsrResult(
            text=body["text"],
            segments=_segments(body),
            language=code or language or self.languages[0],
        )


def _segments(body: dict[str, Any]) -> tuple[Segment, ...]:
    """verbose_json's segments (seconds) as ms, each with the words inside its span."""
    raw = body.get("segments")
    if not isinstance(raw, list):
        return ()
    words = [_word(w) for w in body.get("words") or () if isinstance(w, dict)]
    out: list[Segment] = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        start, end = _ms(item.get("start")), _ms(item.get("end"))
        out.append(
            Segment(
                text=str(item.get("text", "")),
                start_ms=start,
                end_ms=end,
                avg_logprob=_float(item.get("avg_logprob")),
                compression_ratio=_float(item.get("compression_ratio")),
                no_speech_prob=_float(item.get("no_speech_prob")),
                temperature=_float(item.get("temperature")),
                words=tuple(w for w in words if w is not None and start <= w.start_ms < end),
            )
        )
    return tuple(out)


def _word(item: dict[str, Any]) -> Word | None:
    text = item.get("word")
    if not isinstance(text, str):
        return None
    return Word(text, _ms(item.get("start")), _ms(item.get("end")), _float(item.get("probability")))


def _ms(seconds: object) -> int:
    return round(seconds * 1000) if isinstance(seconds, int | float) else 0


def _float(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
