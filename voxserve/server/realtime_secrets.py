"""Realtime client secrets (`ek_...`): short-lived, single-use keys a browser page connects
with instead of the real API key (POST /v1/realtime/client_secrets mints them:
server/realtime_client_secrets.py).

The store is one small sqlite file beside the TTS cache (`client-secrets.sqlite3` in
settings.cache.path().parent), so every process of `serve --workers N` sees the same
secrets: one minted on a worker is redeemed on another. A secret is held only as its SHA-256
digest (as API keys are: server/auth.py), with the minting key's id, the session object it
carries (the client's own JSON, checked at mint) and its expiry. Redeeming is one atomic
`UPDATE ... RETURNING`: of two connections racing with the same secret, exactly one gets it.
A used secret stays as a tombstone until shortly after its expiry, so a second use is told
"already used", not "unknown". The store is bounded: past `max_client_secrets` live secrets
minting is refused (429); expired rows are purged on every mint.

Each call is one short local transaction (WAL, no fsync on commit): it runs on the caller's
thread, the event loop's included. The connection is opened lazily and again after a fork
(a sqlite connection must not cross one). No secret or session content is logged.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.server import realtime_fields as f
from voxserve.server.auth import KeyRing
from voxserve.server.realtime_session import Kind, RealtimeWire
from voxserve.server.realtime_update import speaks_beta, update_beta, update_ga

PREFIX = "ek_"
MIN_TTL_S, MAX_TTL_S = 10, 7200  # OpenAI's range for expires_after.seconds
FILE_NAME = "client-secrets.sqlite3"
TOMBSTONE_S = 600  # a used or expired secret is remembered this long past its expiry
BUSY_TIMEOUT_S = 2.0  # another worker's transaction: each is a few statements
_SCHEMA = """
CREATE TABLE IF NOT EXISTS client_secrets (
    digest BLOB PRIMARY KEY, principal TEXT, session TEXT, expires REAL NOT NULL,
    used INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS client_secrets_expires ON client_secrets (expires);
"""


@dataclass(frozen=True, slots=True)
class Minted:
    value: str  # "ek_" + 43 url-safe characters (256 random bits); shown once, never stored
    expires_at: int  # epoch seconds


@dataclass(frozen=True, slots=True)
class Redeemed:
    principal: str | None  # the key id that minted it (None: minted with auth off)
    session: dict[str, Any] | None  # the session object given at mint
    expires_at: int


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


def _unauthorized(why: str) -> VoxError:
    return VoxError(ErrorCode.UNAUTHORIZED, f"client secret {why}", fatal=True)


class ClientSecrets:
    """The shared store (module docstring). `clock` gives epoch seconds (tests set it)."""

    def __init__(
        self, path: Path, max_secrets: int, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self.max_secrets = max_secrets
        self.clock = clock
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._pid = 0

    def _conn(self) -> sqlite3.Connection:
        if self._db is None or self._pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
            )
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
            except BaseException:
                db.close()
                raise
            self._db, self._pid = db, os.getpid()
        return self._db

    def mint(self, principal: str | None, session: dict[str, Any] | None, ttl_s: int) -> Minted:
        """A new secret for `principal`, carrying `session` (JSON-able), valid `ttl_s`
        seconds. `quota_exceeded` when the store already holds max_secrets live ones."""
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise ValueError(f"ttl_s must be {MIN_TTL_S}..{MAX_TTL_S}")
        value = PREFIX + secrets.token_urlsafe(32)
        now = self.clock()
        expires = now + ttl_s
        carried = None if session is None else json.dumps(session, separators=(",", ":"))
        with self._lock:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM client_secrets WHERE expires <= ?", (now - TOMBSTONE_S,))
                live = db.execute(
                    "SELECT COUNT(*), MIN(expires) FROM client_secrets "
                    "WHERE used = 0 AND expires > ?",
                    (now,),
                ).fetchone()
                if live[0] >= self.max_secrets:
                    raise VoxError(
                        ErrorCode.QUOTA_EXCEEDED,
                        f"the server holds its limit of {self.max_secrets} unused client "
                        "secrets (realtime.max_client_secrets); retry when some expire",
                        retry_after_s=max(1, int(live[1] - now) + 1),
                    )
                (total,) = db.execute("SELECT COUNT(*) FROM client_secrets").fetchone()
                if total >= 2 * self.max_secrets:  # tombstones go first: the bound holds
                    db.execute("DELETE FROM client_secrets WHERE used = 1 OR expires <= ?", (now,))
                db.execute(
                    "INSERT INTO client_secrets (digest, principal, session, expires) "
                    "VALUES (?, ?, ?, ?)",
                    (_digest(value), principal, carried, expires),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return Minted(value, int(expires))

    def redeem(self, value: str) -> Redeemed:
        """Use a secret up (once, atomically); `unauthorized` when it is unknown, already
        used, or expired (each says which)."""
        key, now = _digest(value), self.clock()
        with self._lock:
            db = self._conn()
            row = db.execute(
                "UPDATE client_secrets SET used = 1 "
                "WHERE digest = ? AND used = 0 AND expires > ? "
                "RETURNING principal, session, expires",
                (key, now),
            ).fetchone()
            if row is None:
                found = db.execute(
                    "SELECT used FROM client_secrets WHERE digest = ?", (key,)
                ).fetchone()
        if row is not None:
            principal, carried, expires = row
            session = None if carried is None else json.loads(carried)
            return Redeemed(principal, session, int(expires))
        if found is None:
            raise _unauthorized("is not known (never minted here, or expired long ago)")
        if found[0]:
            raise _unauthorized("was already used: a client secret opens one session")
        raise _unauthorized("has expired: mint a new one")

    def __len__(self) -> int:
        """Rows held (live, used and expired): what the bound applies to."""
        with self._lock:
            (count,) = self._conn().execute("SELECT COUNT(*) FROM client_secrets").fetchone()
        return int(count)

    def close(self) -> None:
        with self._lock:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None


def is_client_secret(token: str | None, keys: KeyRing) -> TypeGuard[str]:
    """`token` is a client secret: `ek_...` and not one of the configured API keys (a key
    may begin so too; it stays a key)."""
    return token is not None and token.startswith(PREFIX) and keys.verify(token) is None


def realtime_principal(
    keys: KeyRing, secrets: ClientSecrets, token: str | None
) -> tuple[str | None, dict[str, Any] | None]:
    """Who a Realtime connection (WebSocket /v1/realtime or POST /v1/realtime/calls) is, from
    its bearer token: an API key -> (its key id, None); a client secret -> redeemed (used up
    here) -> (the id of the key that minted it, so its quotas apply, and the session object
    it carries, to apply before session.created). With auth off a plain token or none is
    ("anonymous", None) and a client secret is still redeemed. Raises `unauthorized`
    (fatal): a wrong key, or a secret unknown, used, expired, or whose key is no longer
    configured. No I/O but the store."""
    if is_client_secret(token, keys):
        redeemed = secrets.redeem(token)
        principal = redeemed.principal
        if keys.enabled and principal not in keys.key_ids:
            raise _unauthorized("was minted with an API key that is no longer accepted")
        return principal, redeemed.session
    return keys.authenticate(token), None


_STORES: weakref.WeakKeyDictionary[Runtime, ClientSecrets] = weakref.WeakKeyDictionary()


def secrets_of(runtime: Runtime) -> ClientSecrets:
    """The one store of `runtime` (opened on first use, as quotas.quotas_of): the minting
    route, /v1/realtime and the calls route share it."""
    store = _STORES.get(runtime)
    if store is None:
        settings = runtime.settings
        path = settings.cache.path().parent / FILE_NAME
        store = _STORES[runtime] = ClientSecrets(path, settings.realtime.max_client_secrets)
    return store


def session_kind(session: dict[str, Any] | None, default: Kind) -> Kind:
    """The kind a secret's session object names (`type`), else `default` (the connection's
    `?intent=`): a secret minted for a transcription session opens one."""
    if session is None:
        return default
    kind = f.choice(session, "type", "session", ("realtime", "transcription"))
    if kind is None:
        return default
    return "transcription" if kind == "transcription" else "realtime"


def apply_session(wire: RealtimeWire, session: dict[str, Any]) -> None:
    """A session object (GA names, or beta's) made the settings `wire` opens with, checked
    in full as session.update is (the voice against the installed ones too): raises the
    code docs/realtime.md gives, naming the field ("session.audio.output.voice")."""
    if speaks_beta(session):
        settings = update_beta(wire.settings, session)
    else:
        settings = update_ga(wire.settings, session)
    wire.config(settings)  # raises for what only the engines can say (an unknown voice)
    wire.settings = settings
