"""OpenAI's voice names -> the installed voices, for every OpenAI-compatible route:
`/v1/audio/speech` (server/http/speech.py), the Realtime API's `voice`
(server/realtime_api/session.py) and the aliases `/v1/voices` lists (server/http/audio.py).

A client written for OpenAI asks for `alloy` or `marin`; voxserve speaks with the voices
its TTS engines have. A name is looked up in this order:
1. an installed voice id (or an engine's own alias of one) is taken as it is;
2. an OpenAI name in the table `tts.openai_voices` (config) speaks the voice it names;
3. any other OpenAI name picks an installed voice, the same one every time for the same
   installed set: `alloy` (the first name) is the server's default voice, the next names
   go round the other voices of the default voice's language (regions aside: en_GB is
   English) in sorted order (an English server's `onyx` is never its Mandarin voice; all
   voices when none other shares it);
4. anything else selects no voice: `unknown_voice`, listing the installed ids and OpenAI's
   names.
The table is checked against the installed voices when `voxserve serve` starts
(`check_table`), so an entry naming a voice that is not there stops the server at once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from voxserve.config import ConfigError
from voxserve.engines.loaded import Engines
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.types import Voice

OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)
"""Every voice name OpenAI's speech and Realtime APIs have had (docs/realtime.md)."""

TABLE_SETTING = "tts.openai_voices"


def voice_names(voices: Iterable[Voice]) -> tuple[str, ...]:
    """Every name that selects an installed voice: the ids, then the engines' aliases."""
    listed = list(voices)
    return (*(v.id for v in listed), *(alias for v in listed for alias in v.aliases))


def openai_picks(
    ids: Sequence[str],
    default: str,
    languages: Mapping[str, str] | None = None,
    table: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Each OpenAI name -> the installed voice it speaks (steps 2 and 3 of the module
    docstring); `languages`: voice id -> language (none known: every voice is kin)."""
    language_of = {v: _base(language) for v, language in (languages or {}).items()}
    language = language_of.get(default)
    kin = sorted(v for v in ids if v != default and language_of.get(v) == language)
    others = kin or sorted(v for v in ids if v != default)
    choices = [default, *others]
    picks = {name: choices[i % len(choices)] for i, name in enumerate(OPENAI_VOICES)}
    return picks | dict(table or {})


def _base(language: str) -> str:
    """A voice's language without its region: an en_GB voice is kin of an en one."""
    return language.replace("-", "_").split("_", 1)[0].lower()


def picks_of(
    voices: Sequence[Voice], default: str, table: Mapping[str, str] | None = None
) -> dict[str, str]:
    """openai_picks for installed voices (their ids and languages)."""
    languages = {v.id: v.language for v in voices}
    return openai_picks([v.id for v in voices], default, languages, table)


def installed_voice(name: str, installed: Collection[str], picks: Mapping[str, str]) -> str:
    """The installed voice `name` selects (the order in the module docstring; `picks` from
    openai_picks), else `name` itself (not a voice: the caller says so)."""
    if name in installed or name not in OPENAI_VOICES:
        return name
    return picks.get(name, name)


def openai_voice(engines: Engines, name: str | None, table: Mapping[str, str]) -> str | None:
    """The installed voice a request's `voice` selects; None or "" (the default) stays so.
    Raises `unknown_voice` for a name that selects none."""
    if not name:
        return name
    voices = engines.voices()
    names = voice_names(voices)
    voice = installed_voice(name, names, picks_of(voices, engines.default_voice, table))
    if voice not in names:
        raise unknown_voice(name, engines.voices())
    return voice


def requested(engines: Engines, value: object, table: Mapping[str, str]) -> str | None:
    """The installed voice a speech request's `voice` selects: a name, or OpenAI's custom
    voice object `{"id": ...}` (taken as a name); None when absent (the default voice)."""
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        value = value["id"]
    if value is None or isinstance(value, str):
        return openai_voice(engines, value, table)
    raise VoxError(ErrorCode.INVALID_PARAMETER, 'voice must be a string or {"id": string}')


def unknown_voice(name: str, voices: Iterable[Voice]) -> VoxError:
    """The 400 for a name that selects no voice: what would have been valid."""
    installed = ", ".join(sorted(v.id for v in voices)) or "none"
    openai = ", ".join(OPENAI_VOICES)
    return VoxError(
        ErrorCode.UNKNOWN_VOICE,
        f"unknown voice {quoted(name)}; valid voices: {installed}; OpenAI names: {openai}",
    )


def openai_aliases(
    voices: Sequence[Voice], default: str, table: Mapping[str, str]
) -> dict[str, list[str]]:
    """Installed voice id -> the OpenAI names that speak it (for /v1/voices). A name that is
    itself an installed voice id is that voice, not an alias."""
    names = voice_names(voices)
    picks = picks_of(voices, default, table)
    owner = {v.id: v.id for v in voices} | {a: v.id for v in voices for a in v.aliases}
    aliases: dict[str, list[str]] = {v.id: [] for v in voices}
    for name in OPENAI_VOICES:
        if name in owner:
            continue
        voice = owner.get(installed_voice(name, names, picks))
        if voice is not None:
            aliases[voice].append(name)
    return aliases


def check_table(table: Mapping[str, str], voices: Sequence[Voice]) -> None:
    """Refuse a table with a key that is not an OpenAI name or a value that is not an
    installed voice (ConfigError: `serve` prints one line and exits 2)."""
    for name, voice in table.items():
        if name not in OPENAI_VOICES:
            raise ConfigError(
                f"invalid setting {TABLE_SETTING}: {name!r} is not an OpenAI voice name; "
                f"the names are {', '.join(OPENAI_VOICES)}"
            )
        if voice not in voice_names(voices):
            installed = ", ".join(sorted(v.id for v in voices)) or "none"
            raise ConfigError(
                f"invalid setting {TABLE_SETTING}: {name!r} maps to {voice!r}, which is not "
                f"an installed voice; installed voices: {installed}"
            )
