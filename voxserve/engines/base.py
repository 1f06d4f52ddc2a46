"""The engine protocols. Engines are loaded once per process and shared by every session.

Constructors take keyword options only, all with defaults; the runtime passes `threads`
(the engine's intra-op thread count) to every VAD/ASR/TTS engine unless the config sets it.
Model calls are blocking and run on the adaptive executor; per-stream state lives in small
objects the pipeline owns (VAD state) or in the pipeline itself (the growing ASR utterance),
never inside the shared engine. Every engine must be safe to call from several executor
threads at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from voxserve.events import ToolSpec
from voxserve.types import AsrOptions, AsrResult, AsrTask, EngineInfo, Voice

Float32Array = npt.NDArray[np.float32]
Int16Array = npt.NDArray[np.int16]


@runtime_checkable
class VadEngine(Protocol):
    """Speech probability per fixed window of 16 kHz audio."""

    info: EngineInfo
    window_samples: int
    """Samples per decision at 16 kHz (silero: 512 = 32 ms)."""

    def new_state(self) -> Any:
        """Per-stream recurrent state; small (a few KB). Owned by the session."""
        ...

    def reset_state(self, state: Any) -> None:
        """Forget the stream's history (e.g. after a long gap)."""
        ...

    def speech_probs(self, state: Any, audio: Float32Array) -> Float32Array:
        """One probability in [0, 1] per window; len(audio) is a multiple of window_samples.

        Blocking. Updates `state` in place.
        """
        ...


@runtime_checkable
class AsrEngine(Protocol):
    """Whole-buffer recognition; the pipeline carries the streaming state across chunks."""

    info: EngineInfo
    languages: tuple[str, ...]

    def transcribe(
        self,
        audio: Float32Array,
        *,
        language: str | None = None,
        partial: bool = False,
        options: AsrOptions | None = None,
    ) -> AsrResult:
        """Recognise 16 kHz mono float32 audio. `partial=True` asks for the cheap path used
        for interim results while the user is still speaking. `options` (None: the engine's
        defaults) carries a request's prompt, temperature, word timestamps and task; an
        engine without scores or word times ignores those, and one that cannot `translate`
        (see `asr_tasks`) raises ValueError for it. Blocking. Raises ValueError for a
        language it does not serve.

        An engine may also have `transcribe_many(audios, *, language=None, partial=False,
        options=None) -> list[AsrResult]` (one batch, the same options for every row, each
        result what `transcribe` gives alone; with a `turn_hints` parameter, it is passed
        False for an upload's windows, whose finals end no turn) and `tasks` (see
        `asr_tasks`)."""
        ...


@runtime_checkable
class TtsEngine(Protocol):
    """Streaming synthesis: yields int16 chunks at `sample_rate` as soon as each is ready."""

    info: EngineInfo
    sample_rate: int

    def voices(self) -> tuple[Voice, ...]: ...

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[Int16Array]:
        """Blocking generator; the caller pulls one chunk per executor call, so a cancelled
        request stops between chunks. The first chunk should come as early as the engine
        allows (first clause). Each chunk's work must be bounded whatever the text (cut it
        with voxserve.text.bounded_pieces, and bound a model call's input after any
        expansion, as piper does with phoneme ids): it is what a timed-out or cancelled
        request still waits for. Calling it must be cheap (it runs on the event loop):
        validate and raise ValueError at once, and do the model work inside the generator."""
        ...


@dataclass(frozen=True, slots=True)
class PromptRules:
    """What a voice prompt must be for an engine that makes voices from one: the caller
    decodes the recording to mono int16 at `rate`, refuses one shorter than `min_s` or
    longer than `max_s`, and fills in `default_language` when the client names none."""

    rate: int  # Hz
    min_s: float
    max_s: float
    default_language: str


@runtime_checkable
class VoiceRegistration(Protocol):
    """A capability a TTS engine may add: voices registered at run time from a recorded
    prompt (zero-shot cloning), which the admin routes `/admin/voices/{engine}` call. The
    routes know no engine by name; to one without this capability they answer
    `invalid_parameter` ("does not register voices"). Registering and removing are
    blocking (they keep the prompt on disk, so a voice survives a restart) and must be safe
    beside synthesis on other threads; a voice registered appears in `voices()`."""

    prompt_rules: PromptRules

    def registered_voices(self) -> tuple[Voice, ...]:
        """The voices registered this way (not those of the engine's configuration)."""
        ...

    def register_voice(
        self,
        voice_id: str,
        pcm: Int16Array,
        prompt_text: str,
        language: str,
        description: str = "",
    ) -> Voice:
        """Register (or replace) `voice_id` from `pcm` (mono at `prompt_rules.rate`);
        `prompt_text` is what the prompt says ("" when not given). ValueError (its message
        for the client) for an id or field the engine refuses."""
        ...

    def unregister_voice(self, voice_id: str) -> bool:
        """Forget a registered voice and its files; False if there was none."""
        ...


@runtime_checkable
class Responder(Protocol):
    """The text step between ASR and TTS (NLU, rules, an LLM)."""

    info: EngineInfo

    def respond(self, text: str, history: Sequence[tuple[str, str]]) -> AsyncIterator[str]:
        """Stream the reply as text pieces. `history` holds (user, assistant) turns."""
        ...


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the assistant made earlier in the conversation (chat history)."""

    call_id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of the conversation as a chat model reads it: `tool_calls` only on
    assistant messages, `call_id` only on tool messages (the output of that call)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ReplyRequest:
    """Everything a conversation session asks of a responder for one reply. None fields:
    the responder's own setting (its system prompt, its token limit)."""

    messages: tuple[ChatMessage, ...]  # oldest first; the newest turn last
    instructions: str | None = None  # replaces the responder's system prompt
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None  # auto | none | required | a tool's name
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call as the model streams it: calls are told apart by `index`;
    `call_id` and `name` come with a call's first piece (None after), `arguments` is the
    next piece of its JSON text."""

    index: int
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class ReplyUsage:
    """The tokens a reply took, as the model's server counted them (chat completions'
    `usage`): a Conversant yields it once, after the reply, when its server reports one."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0


@runtime_checkable
class Conversant(Protocol):
    """A responder that reads the whole conversation and may call tools (an LLM). Others
    (rules, echo) only `respond`: conversation sessions then pass the last user text and
    the (user, assistant) turns, and offer them no tools."""

    def converse(self, request: ReplyRequest) -> AsyncIterator[str | ToolCallDelta | ReplyUsage]:
        """Stream the reply: text pieces (regrouped for speech, as `respond` does) and the
        tool calls' pieces as they come, then its ReplyUsage if the model's server counted
        it. Closing the stream early stops the model's work."""
        ...


class Closeable(Protocol):
    def close(self) -> None: ...


def inline_safe(engine: object) -> bool:
    """Whether `engine` allows its calls on the event loop when they measure cheaper than a
    thread hop (pipeline/scheduling/stage.py): it says so with `inline_safe = True`, promising calls
    of bounded CPU with no I/O, locks or sleeps. Absent means no: a call that may block would
    stall every stream."""
    return getattr(engine, "inline_safe", False) is True


def fork_safe(engine_class: object) -> bool:
    """Whether an engine built in a parent process works in a forked child (`serve
    --workers N` builds such engines once, before fork, and the workers share them). The
    class says so with `fork_safe = True`, promising its calls need no thread the engine or
    its library started (a child has none of the parent's threads: CTranslate2's replica
    thread makes whisper's first transcription hang there). Absent means no: the engine is
    built in each worker. tests/memory/test_workers.py forks and calls each that says so."""
    return getattr(engine_class, "fork_safe", False) is True


def short_first_piece(engine: object) -> bool:
    """Whether a TTS engine can cut its first piece short for a live reply's first audio
    (piper: at its first clause end, "Good morning," 0.8 s). It says so with
    `short_first_piece = True`, and its `synthesize` then takes `short_first: bool = True`:
    the pipeline passes False for a one-shot request (pipeline/synthesis/engine_chunks.py),
    whose listener has the whole text ahead and whose next piece, in a burst, waits behind
    the other requests' first pieces. Absent means no such choice: a streaming engine's
    chunks go out as they come. The choice must keep chunk k the same piece of text on
    every replica of the engine (a cluster resumes a stream by chunk count)."""
    return getattr(engine, "short_first_piece", False) is True


def first_piece_choice(engine: object, short: bool) -> dict[str, bool]:
    """The `synthesize` keyword that gives an engine offering it the first-piece choice
    (`short_first_piece`); none for an engine without it."""
    return {"short_first": short} if short_first_piece(engine) else {}


TRANSCRIBE_ONLY: tuple[AsrTask, ...] = ("transcribe",)


def asr_tasks(engine: object) -> tuple[AsrTask, ...]:
    """The tasks an ASR engine performs: its `tasks` attribute, else transcription only
    (an English-only Whisper such as tiny.en cannot translate)."""
    tasks = getattr(engine, "tasks", None)
    if isinstance(tasks, tuple) and all(t in ("transcribe", "translate") for t in tasks):
        return tasks
    return TRANSCRIBE_ONLY


def close_engine(engine: object) -> None:
    """Release an engine's resources if it has any."""
    close = getattr(engine, "close", None)
    if callable(close):
        close()


def voices_of(engines: Sequence[TtsEngine]) -> list[Voice]:
    return [voice for engine in engines for voice in engine.voices()]
