"""OpenAI's voice names -> the installed voices, for every OpenAI-compatible route: the
Realtime API's `voice` (server/realtime_session.py) and, later, `/v1/audio/speech`.

A client written for OpenAI asks for `alloy` or `marin`; voxserve speaks with the voices
its TTS engines have. An installed voice id is taken as it is; an OpenAI name picks an
installed voice, the same one every time for the same installed set: `alloy` (the first
name) is the server's default voice, the next names go round the others in sorted order.
Anything else is returned unchanged, so the session refuses it as `unknown_voice`.
"""

from __future__ import annotations

from collections.abc import Collection

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


def installed_voice(name: str, installed: Collection[str], default: str) -> str:
    """The installed voice `name` selects: itself if installed, one picked for an OpenAI
    name (module docstring), else `name` (not a voice: the session says so)."""
    if name in installed or name not in OPENAI_VOICES:
        return name
    choices = [default, *sorted(v for v in installed if v != default)]
    return choices[OPENAI_VOICES.index(name) % len(choices)]
