"""The cosyvoice engine's voices: the `voices` option (voxserve voice id -> a built-in
CosyVoice speaker) and the zero-shot voices registered through the admin API, kept on disk.

A table entry is a speaker id (`"zh-woman": "中文女"`) or an object with `spk_id` and
optionally `language` (default zh), `instruct` (a style instruction: the voice then makes
instruct requests) and `description`. A zero-shot voice is a prompt recording (kept as a
16 kHz mono WAV) and the prompt's transcript: with a transcript it makes zero-shot requests,
without one cross-lingual requests. Each lives as `<id>.wav` + `<id>.json` in the store's
directory, so a restart keeps it; the JSON is written last, and a voice is only read back
when both are there.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxserve.audio.pcm import Int16Array
from voxserve.audio.wav import read_wav, write_wav
from voxserve.engines.cosyvoice_request import PROMPT_RATE, CosyRequest, Prompt, RequestKind
from voxserve.private_files import private_dir
from voxserve.types import Voice

log = logging.getLogger(__name__)

ENGINE = "cosyvoice"
DEFAULT_LANGUAGE = "zh"
TABLE_KEYS = ("spk_id", "language", "instruct", "description")
VOICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_PROMPT_S = 30.0  # CosyVoice's prompts are a few seconds; longer ones only cost memory
MIN_PROMPT_S = 1.0  # shorter gives CosyVoice's speech tokenizer next to nothing to clone


@dataclass(frozen=True, slots=True)
class CosyVoiceEntry:
    """One voxserve voice and the CosyVoice request it makes."""

    voice: Voice
    kind: RequestKind
    spk_id: str = ""
    instruct_text: str = ""
    prompt: Prompt | None = None

    def request(self, text: str, speed: float) -> CosyRequest:
        return CosyRequest(
            self.kind, text, self.spk_id, self.prompt, self.instruct_text, speed=speed
        )


def check_voice_id(voice_id: str) -> str:
    if not VOICE_ID.fullmatch(voice_id):
        raise ValueError(
            f"voice id {voice_id[:80]!r} must be 1-64 letters, digits, '_', '.' or '-' "
            "(starting with a letter or digit)"
        )
    return voice_id


def parse_table(table: dict[str, Any], sample_rate: int) -> dict[str, CosyVoiceEntry]:
    """The `voices` option; ValueError naming the voice and the bad key."""
    if not isinstance(table, dict):
        raise ValueError("voices must be an object: voxserve voice id -> CosyVoice spk_id")
    entries: dict[str, CosyVoiceEntry] = {}
    for voice_id, value in table.items():
        check_voice_id(voice_id)
        spec: dict[str, Any] = {"spk_id": value} if isinstance(value, str) else value
        if not isinstance(spec, dict):
            raise ValueError(f"voices[{voice_id!r}] must be a spk_id string or an object")
        unknown = sorted(set(spec) - set(TABLE_KEYS))
        if unknown:
            raise ValueError(
                f"voices[{voice_id!r}] has unknown key {unknown[0]!r}; "
                f"valid: {', '.join(TABLE_KEYS)}"
            )
        spk_id = spec.get("spk_id")
        if not isinstance(spk_id, str) or not spk_id:
            raise ValueError(f"voices[{voice_id!r}] needs spk_id (a CosyVoice speaker id)")
        strings = {key: spec.get(key, "") for key in ("language", "instruct", "description")}
        bad = next((key for key, v in strings.items() if not isinstance(v, str)), None)
        if bad is not None:
            raise ValueError(f"voices[{voice_id!r}].{bad} must be a string")
        instruct = strings["instruct"]
        description = strings["description"] or f"CosyVoice speaker {spk_id}"
        language = strings["language"] or DEFAULT_LANGUAGE
        voice = Voice(voice_id, ENGINE, language, sample_rate, description)
        kind: RequestKind = "instruct" if instruct else "sft"
        entries[voice_id] = CosyVoiceEntry(voice, kind, spk_id, instruct)
    return entries


def prompt_entry(
    voice_id: str, prompt: Prompt, language: str, sample_rate: int, description: str = ""
) -> CosyVoiceEntry:
    kind: RequestKind = "zero_shot" if prompt.text else "cross_lingual"
    what = "zero-shot" if prompt.text else "cross-lingual"
    voice = Voice(voice_id, ENGINE, language, sample_rate, description or f"CosyVoice {what} voice")
    return CosyVoiceEntry(voice, kind, prompt=prompt)


class ZeroShotStore:
    """The registered prompt voices of one engine, one WAV and one JSON file each."""

    def __init__(self, directory: Path, sample_rate: int) -> None:
        self.directory = directory
        self.sample_rate = sample_rate

    def load(self) -> dict[str, CosyVoiceEntry]:
        """Every complete voice in the directory (none if it does not exist yet)."""
        entries: dict[str, CosyVoiceEntry] = {}
        if not self.directory.is_dir():
            return entries
        for meta_path in sorted(self.directory.glob("*.json")):
            voice_id = meta_path.stem
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
                wav_path = self.directory / f"{voice_id}.wav"
                samples, rate = read_wav(wav_path.read_bytes())
                if rate != PROMPT_RATE:
                    raise ValueError(f"prompt rate {rate}")
                prompt = Prompt(samples.tobytes(), wav_path, str(meta.get("prompt_text", "")))
                entries[check_voice_id(voice_id)] = prompt_entry(
                    voice_id,
                    prompt,
                    str(meta.get("language", DEFAULT_LANGUAGE)),
                    self.sample_rate,
                    str(meta.get("description", "")),
                )
            except Exception as exc:  # a bad file skips its voice, never the engine's start
                log.warning(
                    "cosyvoice voice skipped", extra={"voice": voice_id, "reason": repr(exc)}
                )
        return entries

    def add(
        self,
        voice_id: str,
        pcm16k: Int16Array,
        prompt_text: str,
        language: str,
        description: str = "",
    ) -> CosyVoiceEntry:
        """Write a voice (replacing one of the same id) and return it. `pcm16k`: the prompt
        recording, 16 kHz mono."""
        check_voice_id(voice_id)
        private_dir(self.directory)  # 0700; each file 0600 (mkstemp's)
        wav_path = self.directory / f"{voice_id}.wav"
        meta = {"prompt_text": prompt_text, "language": language, "description": description}
        _write_atomically(wav_path, write_wav(pcm16k, PROMPT_RATE))
        _write_atomically(
            self.directory / f"{voice_id}.json", json.dumps(meta, ensure_ascii=False).encode()
        )
        prompt = Prompt(pcm16k.tobytes(), wav_path, prompt_text)
        return prompt_entry(voice_id, prompt, language, self.sample_rate, description)

    def remove(self, voice_id: str) -> bool:
        """Delete a voice's files; False if there was none. The JSON goes first, so a
        crash in between leaves no half voice that would load."""
        check_voice_id(voice_id)
        meta = self.directory / f"{voice_id}.json"
        if not meta.exists():
            return False
        meta.unlink()
        (self.directory / f"{voice_id}.wav").unlink(missing_ok=True)
        return True


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one; a temporary file of its own per write, so
    two writers of one voice never move each other's half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:  # 0600: a voice prompt is someone's recording
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
