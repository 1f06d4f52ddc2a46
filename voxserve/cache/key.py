"""What makes two speech requests the same reply: the cache key.

The key is a sha256 over a canonical encoding of everything that changes the audio: the
normalised text, the voice, the speed (to 0.01), the output rate and encoding, the
engine's fingerprint (name, package and version, model, the options it was built with, and
anything extra it declares), and the scope (whose cache: shared, or one API key's).
Upgrading a model package or changing an engine option gives new keys, so stale audio is
never served: old entries simply age out.

Text is folded only in ways that never change what is spoken: Unicode NFC (composed and
decomposed accents are one text) and white space. NFKC is not used: it maps "10³" to "103",
"½" to "1⁄2", "Ⅻ" to "XII" and "™" to "TM", which engines read differently, so one would
have been served the other's audio.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from voxserve import __version__
from voxserve.types import EngineInfo

KEY_SCHEMA = 2
"""Bumped when what voxserve does to engine audio changes (resampling, chunk handling) or
what the key folds (2: NFC instead of NFKC, so entries keyed under NFKC are never served)."""
ENCODING = "pcm_s16le"
"""Entries hold 16-bit little-endian mono PCM at the output rate; WAV framing is added by
the transport, so `wav` and `pcm` HTTP replies at one rate share an entry."""
SPEED_DECIMALS = 2
OPTIONS_NOT_IN_KEY = frozenset({"threads", "api_key", "timeout_s", "max_concurrency"})
"""Engine options that change speed or access, never the audio (a remote engine's rotated
API key keeps its cache)."""


SHARED_SCOPE = ""
"""The scope of entries every caller may be served: the operator's (prewarm, fallback) and
all traffic while authentication is off or `cache.share_across_keys` is set."""


def canonical_text(text: str) -> str:
    """Unicode NFC: the one spelling of canonically equivalent text. Synthesis is given this
    form too (pipeline/synthesis/request.py plan), so the audio is always that of the text the key
    names."""
    return unicodedata.normalize("NFC", text)


def normalise_text(text: str) -> str:
    """NFC, white space collapsed to single spaces, stripped: "Hi  there" and "Hi there" are
    one reply. Case, punctuation and compatibility forms are kept: TTS reads them."""
    return " ".join(canonical_text(text).split())


def normalise_prefix(prefix: str) -> str:
    """A text prefix for invalidation, normalised like the texts it is matched against,
    except that a trailing space is kept ("Hello " does not match "Hellos")."""
    folded = canonical_text(prefix)
    trailing = " " if folded[-1:].isspace() and folded.strip() else ""
    return " ".join(folded.split()) + trailing


def round_speed(speed: float) -> float:
    """Speeds that differ by less than 0.01 sound the same; they share one entry, and the
    synthesis uses the rounded value so the cached audio is what the key says."""
    return round(speed, SPEED_DECIMALS)


@dataclass(frozen=True, slots=True)
class EngineFingerprint:
    """The engine identity that goes into every key of its voices."""

    text: str

    @classmethod
    def of(
        cls, info: EngineInfo, options: Mapping[str, Any] | None = None, extra: str = ""
    ) -> EngineFingerprint:
        kept = {k: v for k, v in sorted((options or {}).items()) if k not in OPTIONS_NOT_IN_KEY}
        parts = [info.name, info.package, info.version, info.model, kept, extra, __version__]
        return cls(_canonical(parts))


@dataclass(frozen=True, slots=True)
class CacheKey:
    """A request's key plus what invalidation needs to find it (voice, normalised text)."""

    digest: str  # 64 hex characters
    voice: str
    text_norm: str
    sample_rate: int
    scope: str = SHARED_SCOPE


def make_key(
    text: str,
    *,
    voice: str,
    speed: float,
    sample_rate: int,
    engine: EngineFingerprint,
    scope: str = SHARED_SCOPE,
) -> CacheKey:
    """`scope`: SHARED_SCOPE, or the API key id whose requests alone may be served this
    entry (another key's timing must not tell it what was said before)."""
    text_norm = normalise_text(text)
    speed_text = f"{round_speed(speed):.{SPEED_DECIMALS}f}"
    parts = [KEY_SCHEMA, text_norm, voice, speed_text, sample_rate, ENCODING, engine.text, scope]
    digest = hashlib.sha256(_canonical(parts).encode("utf-8")).hexdigest()
    return CacheKey(digest, voice, text_norm, sample_rate, scope)


def _canonical(value: object) -> str:
    """One spelling per value: sorted keys, no spaces, non-ASCII kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
