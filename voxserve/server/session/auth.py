"""API keys: parsing, hashing and constant-time verification, with no I/O but the keys file.

A key is held only as its SHA-256 digest, so a config file may carry `sha256:<hex>` entries
instead of the secret itself, and the secret never has to live in server memory as given.
Verification hashes the presented token and compares it with every known digest using
`hmac.compare_digest`, without stopping at the first match: the time taken says nothing
about which key, or how much of one, matched. A key is named in logs and metrics by its
*key id* (the first 8 hex digits of its digest), never by the key.

Transports take the token from where their protocol carries it:

- HTTP: ``Authorization: Bearer <key>``
- WebSocket: the same header, or the subprotocol ``voxserve.bearer.<key>`` (browsers cannot
  set headers on a WebSocket); the server then selects ``voxserve.v1`` if offered, so the
  key is never echoed back in the handshake response
- gRPC: metadata ``authorization: Bearer <key>``
- Wyoming has no place for a key: see `wyoming_allowed`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from voxserve.cache.key import SHARED_SCOPE
from voxserve.config import ConfigError, Settings, read_text_file
from voxserve.errors import ErrorCode, VoxError, quoted

HASH_PREFIX = "sha256:"
SUBPROTOCOL = "voxserve.v1"
BEARER_SUBPROTOCOL_PREFIX = "voxserve.bearer."
ANONYMOUS = "anonymous"  # the key id of every request while auth is off
_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def cache_scope(settings: Settings, principal: str) -> str:
    """Whose TTS cache entries a caller is served (cache/key.py): its own key's, unless the
    cache is shared across keys or the caller is anonymous (auth off, or Wyoming, which
    must then stay on a loopback host: the operator's own traffic)."""
    if principal == ANONYMOUS or settings.cache.share_across_keys:
        return SHARED_SCOPE
    return principal


def key_id(key_digest: bytes) -> str:
    """What logs and metrics show for a key: 8 hex digits of its hash, never the key."""
    return key_digest.hex()[:8]


def parse_key(entry: str) -> bytes:
    """One configured key as its digest: ``sha256:<64 hex>`` is taken as the digest itself,
    anything else is a plain key and hashed here. Empty keys are refused (an empty bearer
    token would otherwise match)."""
    entry = entry.strip()
    if entry.lower().startswith(HASH_PREFIX):
        hexdigest = entry[len(HASH_PREFIX) :].strip().lower()
        if not _HEX_DIGEST.match(hexdigest):
            raise ConfigError("a hashed API key must be sha256: followed by 64 hex digits")
        return bytes.fromhex(hexdigest)
    if not entry:
        raise ConfigError("an API key must not be empty")
    return digest(entry)


def read_keys_file(path: Path) -> list[str]:
    """One key a line (plain or ``sha256:<hex>``); blank lines and ``#`` comments skipped."""
    text = read_text_file(path, "API keys file")
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


class KeyRing:
    """The API keys a server accepts; empty means authentication is off."""

    def __init__(self, digests: Iterable[bytes]) -> None:
        self._digests = tuple(dict.fromkeys(digests))

    @classmethod
    def from_entries(cls, entries: Iterable[str]) -> KeyRing:
        return cls(parse_key(entry) for entry in entries)

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        """`api_keys` (config, `VOXSERVE_API_KEYS`, `--api-key`) plus `api_keys_file`."""
        entries = [key.get_secret_value() for key in settings.api_keys]
        if settings.api_keys_file is not None:
            entries += read_keys_file(settings.api_keys_file)
        return cls.from_entries(entries)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    @property
    def key_ids(self) -> list[str]:
        return [key_id(d) for d in self._digests]

    def verify(self, token: str | None) -> str | None:
        """The key id of `token`, or None. Every digest is compared, match or not."""
        if token is None:
            return None
        presented = digest(token)
        found: bytes | None = None
        for known in self._digests:
            if hmac.compare_digest(presented, known):
                found = known
        return key_id(found) if found is not None else None

    def authenticate(self, token: str | None) -> str:
        """The caller's key id; `unauthorized` unless the token is a known key. With auth
        off everyone is `anonymous`."""
        if not self.enabled:
            return ANONYMOUS
        found = self.verify(token)
        if found is None:
            what = "missing" if token is None else "wrong"
            raise VoxError(
                ErrorCode.UNAUTHORIZED,
                f"{what} API key: send Authorization: Bearer <key>",
                fatal=True,
            )
        return found


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def subprotocol_token(protocols: Sequence[str]) -> str | None:
    """The key of a ``voxserve.bearer.<key>`` WebSocket subprotocol, if one is offered."""
    for protocol in protocols:
        if protocol.startswith(BEARER_SUBPROTOCOL_PREFIX):
            token = protocol[len(BEARER_SUBPROTOCOL_PREFIX) :]
            return token or None
    return None


def is_loopback(host: str) -> bool:
    """Whether `host` listens on loopback only ("" and 0.0.0.0 are every interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_auth_settings(settings: Settings) -> KeyRing:
    """Refuse to start an unauthenticated server on a non-loopback address unless
    `insecure_no_auth` says so, and Wyoming (which cannot carry a key) on a non-loopback
    address while keys are required. Returns the key ring."""
    keys = KeyRing.from_settings(settings)
    loopback = is_loopback(settings.host)
    if not keys.enabled and not loopback and not settings.insecure_no_auth:
        raise ConfigError(
            f"no API keys are configured and --host {settings.host or '*'} is not loopback: "
            "set keys (--api-key, --api-keys-file or VOXSERVE_API_KEYS), or pass "
            "--insecure-no-auth to serve without authentication"
        )
    if keys.enabled and not loopback and settings.wyoming_port:
        raise ConfigError(
            "the Wyoming protocol cannot carry an API key, so it would bypass authentication "
            f"on {settings.host or '*'}: disable it with --wyoming-port 0, or listen on "
            "127.0.0.1 only"
        )
    return keys


def check_origin(
    origin: str | None, host: str, allowed: Sequence[str], *, fatal: bool = False
) -> None:
    """Raise `origin_not_allowed` for a browser request from another site (no `Origin`:
    not a browser, allowed); the one rule of the WebSocket and HTTP `/v1/*`."""
    if origin is not None and not origin_allowed(origin, host, allowed):
        raise VoxError(
            ErrorCode.ORIGIN_NOT_ALLOWED,
            f"origin {quoted(origin)} is not allowed (cors_allowed_origins)",
            fatal=fatal,
        )


def origin_allowed(origin: str, host: str, allowed: Sequence[str]) -> bool:
    """A browser's `Origin` may open the WebSocket when it is the server itself (the page
    served from here: origin host[:port] equals the request's Host) or listed in `allowed`
    (exact scheme://host[:port]; "*" allows any). "null" (sandboxed or file pages) only
    by "*"."""
    if "*" in allowed or origin.rstrip("/") in {a.rstrip("/") for a in allowed}:
        return True
    _, sep, rest = origin.partition("://")
    return bool(sep) and bool(host) and rest.rstrip("/").lower() == host.lower()
