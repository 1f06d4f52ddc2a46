"""Hostile input, engines door (issue 35, finding 4): every engine call is bounded.

A repetitive 540-character `prompt` made Whisper's "redo the row alone" recurse until it
died (CTranslate2 returns one token past `max_length` with a prompt, the redo condition
stayed true): one core busy for 140 s and every other upload 504. Here prompts of each class
(repetitive, long, unicode, special-token-like, empty) go through the real tiny.en engine,
alone and batched, short and past 30 s, and through a real server with the official `openai`
SDK, while a live stream is watched; and a prompt is cut to Whisper's budget (224 tokens
with `<|startofprev|>`, the last ones kept) as OpenAI's and faster-whisper's decoders cut it.
"""

from __future__ import annotations

import asyncio
import http.server
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.audio_files import encode
from tests.conftest import LiveServer
from tests.helpers import fixture_audio, fixture_texts, http_standin, wer
from tests.hostile.watch import watched
from voxserve.engines.openai_tts import MAX_AHEAD_S, MAX_EXTRA_S, PCM_RATE, OpenAITts
from voxserve.engines.whisper_asr import MAX_LENGTH, PROMPT_TOKENS, WhisperAsr
from voxserve.errors import ErrorCode, VoxError
from voxserve.types import AsrOptions

WEDGE = ("turn on the kitchen lights " * 21)[:540]  # the finding's prompt
PROMPTS: dict[str, str] = {
    "wedge": WEDGE,
    "one word": "lights " * 500,
    "one letter": "a" * 4_000,
    "prose": " ".join(f"word{i} is number {i}," for i in range(400))[:4_000],
    "unicode": ("日本語のテキスト 🎙️ مرحبا e\u0301\u200b " * 120)[:4_000],
    "special tokens": "<|endoftext|><|startoftranscript|><|notimestamps|><|0.00|> " * 60,
    "special tail": "turn on the lights <|endoftext|>",
    "empty": "",
    "blank": " \n\t ",
}
pytestmark = pytest.mark.timeout(60)  # an unbounded call hangs: fail in a minute, not two
CALL_BOUND_S = 20.0  # a call takes ~0.3-2 s on a busy two-core machine; the wedge took 140 s
ATTACK_CPU_BOUND_S = 30.0
"""The CPU seconds this process (the server, its decode threads, the clients) may spend on the
prompt uploads: 4.0-4.6 s here, alone or beside 8 busy loops; the wedge burnt 140 s of a core.
Their wall time measures the neighbours on a shared machine (the last answer 3 s alone, 16 s
beside the busy loops), so the uploads are bounded by the work they cost, not by the clock."""
UPLOAD_TIMEOUT_S = 45.0  # within the module's minute: a wedged call fails here, not in pytest


class CountingModel:
    """The real CTranslate2 model, its `generate` calls counted (everything passes through)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.generated = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.generated += 1
        return self.model.generate(*args, **kwargs)


@pytest.fixture(scope="module")
def asr() -> Iterator[WhisperAsr]:
    engine = WhisperAsr()
    yield engine


@pytest.fixture
def counted(asr: WhisperAsr) -> Iterator[CountingModel]:
    real = asr._ct2
    counting = CountingModel(real)
    asr._ct2 = counting
    try:
        yield counting
    finally:
        asr._ct2 = real


def _audio(name: str) -> np.ndarray:
    return (fixture_audio(name) / 32768.0).astype(np.float32)


# --- the prompt budget ----------------------------------------------------------------------


_PIECES = st.sampled_from(
    ["turn on the lights ", "<|endoftext|>", "<|0.00|>", "日本", "🎙️", "a" * 50, " ", "\n", "é"]
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pieces=st.lists(_PIECES, max_size=400), free=st.text(max_size=200))
def test_a_prompt_is_cut_to_whispers_budget(asr: WhisperAsr, pieces: list[str], free: str) -> None:
    """The last 223 text tokens of `" " + prompt.strip()` are kept (OpenAI's
    `n_text_ctx // 2 - 1`, faster-whisper's `get_prompt`), none of them a control token."""
    text = "".join(pieces) + free
    tokens = asr.prompt_tokens(text)
    assert len(tokens) <= PROMPT_TOKENS
    assert all(t < asr._tokenizer.eot for t in tokens)  # `<|endoftext|>` stays text
    if text.strip():
        everything = asr._prompt_vocab.encode(" " + text.strip(), add_special_tokens=False).ids
        assert tokens == everything[-PROMPT_TOKENS:]  # the last ones
    else:
        assert tokens == []
    plan = asr._plan(False, AsrOptions(prompt=text), None)
    tok = plan.tokenizer
    previous = [tok.sot_prev, *tokens] if tokens else []
    assert plan.prompt == [*previous, *tok.sot_sequence]
    assert len(plan.prompt) <= MAX_LENGTH // 2 + len(tok.sot_sequence)


def test_the_budget_is_faster_whispers_rule(asr: WhisperAsr) -> None:
    """Plain text: the same previous-text tokens as faster-whisper's own `get_prompt`, the last
    ones kept, and what they spell is the end of the prompt."""
    tok = asr._tokenizer
    for name in ("wedge", "one word", "prose", "special tail"):
        text = PROMPTS[name].replace("<|endoftext|>", "")
        stock = asr.whisper_model.get_prompt(tok, tok.encode(" " + text.strip()))
        assert stock[0] == tok.sot_prev
        assert [tok.sot_prev, *asr.prompt_tokens(text)] == stock[: -len(tok.sot_sequence)], name
        assert (" " + text.strip()).endswith(tok.decode(asr.prompt_tokens(text))), name
    assert len(asr.prompt_tokens(PROMPTS["prose"])) == PROMPT_TOKENS  # cut to the budget


# --- the real engine ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_every_prompt_returns_within_bounds(
    asr: WhisperAsr, counted: CountingModel, name: str
) -> None:
    """Alone and batched (rows with different token caps), final and partial: each call
    returns in seconds with a bounded number of model calls (a batch, a row redone alone
    once, a 30 s window once per row) and output within its cap."""
    audios = [_audio("command.wav"), _audio("long.wav")]
    options = AsrOptions(prompt=PROMPTS[name])
    finals: list[str] = []
    for partial in (False, True):
        counted.generated = 0
        started = time.monotonic()
        batch = audios if not partial else audios[:1]  # partial: one, as live streams ask
        results = asr.transcribe_many(batch, partial=partial, options=options)
        finals = finals or [r.text for r in results]
        assert time.monotonic() - started < CALL_BOUND_S, (name, partial)
        assert counted.generated <= 1 + 2 * len(batch), (name, partial, counted.generated)
        for audio, result in zip(batch, results, strict=True):
            seconds = audio.size / 16_000
            tokens = sum(len(s.tokens) for s in result.segments)
            assert tokens <= 16 + 10 * seconds + 1, (name, tokens)
    counted.generated = 0
    alone = asr.transcribe(audios[0], options=options)
    assert counted.generated <= 2, (name, counted.generated)  # the call, its 30 s redo
    assert alone.text == finals[0], name  # a batch still gives each audio its own result


def test_past_30_s_the_prompt_goes_cut_and_the_call_is_bounded(asr: WhisperAsr) -> None:
    """Past 30 s faster-whisper decodes (its own windows, at most six temperatures each, each
    to `max_length`); the prompt reaches it as the same cut token ids, not as a string (its
    own encoding reads `<|endoftext|>` as the control token)."""
    seen: list[Any] = []
    real = asr.whisper_model.transcribe

    def transcribe(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["initial_prompt"])
        return real(*args, **kwargs)

    speech = np.concatenate([_audio("command.wav"), np.zeros(29 * 16_000, np.float32)] * 2)
    asr.whisper_model.transcribe = transcribe  # type: ignore[method-assign]
    try:
        for name in ("wedge", "special tokens"):
            started = time.monotonic()
            result = asr.transcribe(speech, options=AsrOptions(prompt=PROMPTS[name]))
            assert time.monotonic() - started < CALL_BOUND_S, name
            assert "time" in result.text.lower(), (name, result.text)
            assert all(len(s.tokens) < MAX_LENGTH for s in result.segments)
            assert seen.pop() == (asr.prompt_tokens(PROMPTS[name]) or None), name
    finally:
        del asr.whisper_model.transcribe


# --- a real server, the official SDK ------------------------------------------------------


async def test_prompt_uploads_wedge_nothing(live_server: LiveServer) -> None:
    """Every class of prompt uploaded at once is answered 200 at a bounded cost, and a plain
    upload sent while they run is answered with its words (it was 504 for 140 s); the live
    stream beside them keeps its pace and the RSS stays bounded. The test server does not
    refuse them for load (tests/conftest.py `_no_load_shedding`: beside other workers,
    admission refused one four times over as predicted past its 2.5 s budget), and the
    bound is on CPU seconds (ATTACK_CPU_BOUND_S), not on each answer's wall time, which
    there measures the neighbours."""
    wav = encode(fixture_audio("command.wav"), "wav")
    plain_wav = encode(fixture_audio("lights.wav"), "wav")
    async with openai.AsyncOpenAI(
        base_url=live_server.http_url + "/v1",
        api_key="x",
        max_retries=0,  # the first answer: a retried 504 would hide a wedge for minutes
        timeout=UPLOAD_TIMEOUT_S,
    ) as sdk:

        async def upload(prompt: str | None, data: bytes) -> tuple[str, float]:
            started = time.monotonic()
            kwargs: dict[str, Any] = {} if prompt is None else {"prompt": prompt}
            result = await sdk.audio.transcriptions.create(
                model="whisper-1", file=("a.wav", data, "audio/wav"), **kwargs
            )
            return result.text, time.monotonic() - started

        async with watched(live_server.http_url) as watch:
            cpu_before = time.process_time()
            hostile = [asyncio.create_task(upload(p, wav)) for p in PROMPTS.values()]
            await asyncio.sleep(0.2)
            text, plain_s = await upload(None, plain_wav)
            answered = await asyncio.gather(*hostile)
            cpu_s = time.process_time() - cpu_before
    assert wer(fixture_texts()["lights.wav"], text) <= 0.15, text
    assert cpu_s < ATTACK_CPU_BOUND_S, f"the uploads cost {cpu_s:.1f} CPU s"
    watch.assert_unhurt(max_growth_mb=400, max_p99_lag_ms=250)
    print(
        f"prompt wedge: {cpu_s:.1f} CPU s, slowest answer {max(s for _, s in answered):.1f} s,"
        f" plain upload {plain_s:.1f} s, RSS +{watch.rss_growth_mb:.0f} MB"
        f" (peak {watch.rss_peak / 1e6:.0f} MB), live P99 lag {watch.lag_ms(0.99):.0f} ms"
    )


# --- a remote TTS that never stops --------------------------------------------------------


class EndlessSpeech(http.server.BaseHTTPRequestHandler):
    """A remote `/audio/speech` that streams PCM (silence) without end, as fast as it can:
    a stand-in for a broken OpenAI-compatible server (no real one does it on purpose)."""

    protocol_version = "HTTP/1.1"
    sent = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "audio/pcm")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        block = bytes(64 * 1024)
        try:
            while True:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                type(self).sent += len(block)
        except OSError:
            pass  # the engine hung up

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endless() -> Iterator[str]:
    EndlessSpeech.sent = 0
    with http_standin(EndlessSpeech) as url:
        yield url


def test_a_remote_tts_that_never_stops_is_cut_off(endless: str) -> None:
    """Its audio is read at most MAX_AHEAD_S ahead of what was taken (was: as fast as it
    came, without bound), and past its bound for the text it is an `engine_error`."""
    engine = OpenAITts(base_url=endless, voices={"amy": "joe"}, timeout_s=5)
    try:
        chunks = engine.synthesize("Hi.", voice="amy")
        next(chunks)
        time.sleep(0.5)  # an unbounded reader takes in hundreds of MB meanwhile
        ahead = EndlessSpeech.sent
        assert ahead < 2 * MAX_AHEAD_S * PCM_RATE * 2 + 16_000_000, ahead  # + socket buffers
        started, samples = time.monotonic(), 0
        with pytest.raises(VoxError) as failed:
            for chunk in chunks:
                samples += chunk.size
        assert time.monotonic() - started < CALL_BOUND_S
    finally:
        engine.close()
    assert failed.value.code is ErrorCode.ENGINE_ERROR and "cut off" in str(failed.value)
    assert samples <= (MAX_EXTRA_S + 3) * PCM_RATE
