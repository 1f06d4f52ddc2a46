"""Realtime client secrets (`ek_...`): short-lived, single-use keys a browser page connects
with instead of the real API key (POST /v1/realtime/client_secrets mints them:
server/realtime/client_secrets.py).

The store is one small sqlite file, `client-secrets.sqlite3` in `realtime.secrets_dir` (by
default the cache directory; `serve --workers N` gives every worker the parent's, not its
own `worker-N` cache directory), so every process sees the same secrets: one minted on a
worker is redeemed on another. A secret is held only as its SHA-256 digest (as API keys
are: server/session/auth.py), with the minting key's id, the session object it carries (the
client's own, checked at mint, stored compactly: `compact_session`) and its expiry.
Redeeming is one atomic `UPDATE ... RETURNING`: of two connections racing with the same
secret, exactly one gets it. A used secret stays as a tombstone until shortly after its
expiry, so a second use is told "already used", not "unknown". The store is bounded per
key (`max_client_secrets_per_key` unused ones; with auth off every caller is the one
anonymous tenant) and server-wide (`max_client_secrets`); past either minting is refused
(429) and the key's own bound comes first, so one key cannot take the others' secrets.
Expired rows are purged on every mint.

Each call is one short local transaction (WAL, no fsync on commit): it runs on the caller's
thread, the event loop's included. The connection is opened lazily, again after a fork (a
sqlite connection must not cross one), and again when the file was removed under it. A
store that cannot be opened or written (a read-only or vanished directory, a locked file)
is `storage_unavailable` (503; a WebSocket gets the error event and a close frame), never
an exception; `check_store` says so at start. Files are private (voxserve/private_files.py).
No secret or session content is logged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from voxserve.config import ConfigError, Settings
from voxserve.errors import ErrorCode, VoxError
from voxserve.private_files import private_sqlite
from voxserve.runtime import Runtime
from voxserve.server.realtime_api.session import Kind, RealtimeWire
from voxserve.server.realtime_api.update import IGNORED, speaks_beta, update_beta, update_ga
from voxserve.server.session import fields as f
from voxserve.server.session.auth import KeyRing

PREFIX = "ek_"
MIN_TTL_S, MAX_TTL_S = 10, 7200  # OpenAI's range for expires_after.seconds
FILE_NAME = "client-secrets.sqlite3"
TOMBSTONE_S = 600  # a used or expired secret is remembered this long past its expiry
BUSY_TIMEOUT_S = 2.0  # another worker's transaction: each is a few statements
RETRY_S = 5  # Retry-After of `storage_unavailable`
SESSION_BYTES = 16 * 1024  # default of realtime.max_client_secret_session_bytes
_SCHEMA = """
CREATE TABLE IF NOT EXISTS client_secrets (
    digest BLOB PRIMARY KEY, principal TEXT, session TEXT, expires REAL NOT NULL,
    used INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS client_secrets_expires ON client_secrets (expires);
CREATE INDEX IF NOT EXISTS client_secrets_live ON client_secrets (principal, used, expires);
"""


@dataclass(frozen=True, slots=True)
class Minted:
    value: str  # "ek_" + 43 url-safe characters (256 random bits); shown once, never stored
    expires_at: int  # epoch seconds


@dataclass(frozen=True, slots=True)
class Redeemed:
    principal: str | None  # the key id that minted it ("anonymous" with auth off)
    session: dict[str, Any] | None  # the session object given at mint (compact_session's)
    expires_at: int


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


def _unauthorized(why: str) -> VoxError:
    return VoxError(ErrorCode.UNAUTHORIZED, f"client secret {why}", fatal=True)


def compact_session(session: dict[str, Any], max_bytes: int) -> str:
    """The session object as stored: compact JSON of the fields that take effect (the
    accepted-and-unused ones, realtime_update.IGNORED, dropped; UTF-8, not \\u escapes).
    `session_too_large` past `max_bytes`."""
    kept = {key: value for key, value in session.items() if key not in IGNORED}
    text = json.dumps(kept, separators=(",", ":"), ensure_ascii=False)
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise VoxError(
            ErrorCode.SESSION_TOO_LARGE,
            f"the session object is {size} bytes as stored, over the limit of {max_bytes} "
            "(realtime.max_client_secret_session_bytes): shorten its instructions or tools, "
            "or send them with session.update once connected",
        )
    return text


_UNUSED = "SELECT COUNT(*), MIN(expires) FROM client_secrets WHERE used = 0 AND expires > ?"


def _check_bound(unused: sqlite3.Cursor, limit: int, now: float, message: str) -> None:
    """`quota_exceeded` when `_UNUSED`'s count is at `limit`, retried at its first expiry."""
    count, soonest = unused.fetchone()
    if count >= limit:
        raise VoxError(
            ErrorCode.QUOTA_EXCEEDED, message, retry_after_s=max(1, int(soonest - now) + 1)
        )


class ClientSecrets:
    """The shared store (module docstring). `clock` gives epoch seconds (tests set it)."""

    def __init__(
        self,
        path: Path,
        max_secrets: int,
        *,
        per_key: int | None = None,
        max_session_bytes: int = SESSION_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.max_secrets = max_secrets
        self.per_key = min(per_key or max_secrets, max_secrets)
        self.max_session_bytes = max_session_bytes
        self.clock = clock
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._pid = 0
        self._inode = 0

    def _conn(self) -> sqlite3.Connection:
        if self._db is not None and self._pid == os.getpid():
            try:
                if os.stat(self.path).st_ino == self._inode:
                    return self._db
            except FileNotFoundError:
                pass
            self._db.close()  # the file went (a removed directory): open the one there now
        self._db = None
        db = sqlite3.connect(
            private_sqlite(self.path),
            isolation_level=None,
            check_same_thread=False,
            timeout=BUSY_TIMEOUT_S,
        )
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
        except BaseException:
            db.close()
            raise
        self._db, self._pid, self._inode = db, os.getpid(), os.stat(self.path).st_ino
        return db

    @contextlib.contextmanager
    def _using(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock; a failure of the file or directory made
        `storage_unavailable` (and the connection dropped, to be opened anew next time)."""
        with self._lock:
            try:
                yield self._conn()
            except (OSError, sqlite3.Error) as exc:
                if self._db is not None and self._pid == os.getpid():
                    with contextlib.suppress(sqlite3.Error):
                        self._db.close()
                self._db = None
                reason = getattr(exc, "strerror", None) or str(exc)
                raise VoxError(
                    ErrorCode.STORAGE_UNAVAILABLE,
                    f"the client-secret store cannot be used ({reason}); the server's "
                    "realtime.secrets_dir (default: the cache directory) must be writable",
                    fatal=True,
                    retry_after_s=RETRY_S,
                ) from None

    def check(self) -> None:
        """Open (creating the directory and file) and write once: OSError or sqlite3.Error
        when this store cannot work."""
        with self._lock:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")

    def mint(self, principal: str | None, session: dict[str, Any] | None, ttl_s: int) -> Minted:
        """A new secret for `principal`, carrying `session` (JSON-able), valid `ttl_s`
        seconds. `session_too_large` past max_session_bytes; `quota_exceeded` when the
        key already holds per_key live ones, or the store max_secrets."""
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise ValueError(f"ttl_s must be {MIN_TTL_S}..{MAX_TTL_S}")
        carried = None if session is None else compact_session(session, self.max_session_bytes)
        value = PREFIX + secrets.token_urlsafe(32)
        now = self.clock()
        expires = now + ttl_s
        with self._using() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM client_secrets WHERE expires <= ?", (now - TOMBSTONE_S,))
                self._check_bounds(db, principal, now)
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
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return Minted(value, int(expires))

    def _check_bounds(self, db: sqlite3.Connection, tenant: str | None, now: float) -> None:
        """The key's own bound first (so its 429 names it; none when it is the server's),
        then the server's."""
        if self.per_key < self.max_secrets:
            _check_bound(
                db.execute(_UNUSED + " AND principal IS ?", (now, tenant)),
                self.per_key,
                now,
                f"this key holds its limit of {self.per_key} unused client secrets "
                "(realtime.max_client_secrets_per_key); retry when some are used or expire",
            )
        _check_bound(
            db.execute(_UNUSED, (now,)),
            self.max_secrets,
            now,
            f"the server holds its limit of {self.max_secrets} unused client "
            "secrets (realtime.max_client_secrets); retry when some expire",
        )

    def redeem(self, value: str) -> Redeemed:
        """Use a secret up (once, atomically); `unauthorized` when it is unknown, already
        used, or expired (each says which)."""
        key, now = _digest(value), self.clock()
        with self._using() as db:
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
        with self._using() as db:
            (count,) = db.execute("SELECT COUNT(*) FROM client_secrets").fetchone()
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


def store_path(settings: Settings) -> Path:
    """Where the store is: realtime.secrets_dir, else the cache directory."""
    return (settings.realtime.secrets_dir or settings.cache.path().parent) / FILE_NAME


def store_for(settings: Settings) -> ClientSecrets:
    realtime = settings.realtime
    return ClientSecrets(
        store_path(settings),
        realtime.max_client_secrets,
        per_key=realtime.max_client_secrets_per_key,
        max_session_bytes=realtime.max_client_secret_session_bytes,
    )


def secrets_of(runtime: Runtime) -> ClientSecrets:
    """The one store of `runtime` (opened on first use, as quotas.quotas_of): the minting
    route, /v1/realtime and the calls route share it."""
    store = _STORES.get(runtime)
    if store is None:
        store = _STORES[runtime] = store_for(runtime.settings)
    return store


def check_store(settings: Settings) -> None:
    """At `serve` start: the store's directory and file can be created and written, or one
    ConfigError line (exit 2) saying which directory and why."""
    store = store_for(settings)
    try:
        store.check()
    except (OSError, sqlite3.Error) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            f"the client-secret store {store.path} cannot be written ({reason}): give "
            "--cache-dir (or realtime.secrets_dir) a writable directory"
        ) from None
    finally:
        store.close()


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
