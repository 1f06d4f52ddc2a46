"""The pure auth helpers: key parsing and hashing, constant-time verification, token
extraction per transport, the loopback rule and the Origin check."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest
from pydantic import SecretStr

from voxserve.config import ConfigError, Settings, load_settings
from voxserve.errors import ErrorCode, VoxError
from voxserve.server.session import auth
from voxserve.server.session.auth import KeyRing


def test_plain_and_hashed_keys_verify_alike() -> None:
    hashed = "sha256:" + hashlib.sha256(b"s3cret").hexdigest()
    ring = KeyRing.from_entries(["plain-key", hashed.upper().replace("SHA256", "sha256")])
    assert ring.verify("plain-key") == auth.key_id(auth.digest("plain-key"))
    assert ring.verify("s3cret") == hashlib.sha256(b"s3cret").hexdigest()[:8]
    assert ring.verify("wrong") is None
    assert ring.verify(None) is None
    assert ring.verify(hashed) is None  # the hash is not itself a key


@pytest.mark.parametrize("entry", ["", "   ", "sha256:abc", "sha256:" + "g" * 64])
def test_bad_key_entries_are_config_errors(entry: str) -> None:
    with pytest.raises(ConfigError):
        auth.parse_key(entry)


def test_every_digest_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    ring = KeyRing.from_entries(["a", "b", "c"])
    assert ring.verify("a") is not None  # matches the first, still compares all three
    assert len(calls) == 3
    assert all(len(a) == len(b) == 32 for a, b in calls)  # digests, never raw keys


def test_authenticate_is_anonymous_when_off_and_unauthorized_when_wrong() -> None:
    assert KeyRing([]).authenticate(None) == auth.ANONYMOUS
    ring = KeyRing.from_entries(["k"])
    for token in (None, "nope"):
        with pytest.raises(VoxError) as caught:
            ring.authenticate(token)
        assert caught.value.code is ErrorCode.UNAUTHORIZED
        assert caught.value.fatal
        assert "k" not in caught.value.message.split()
    assert ring.authenticate("k") == ring.key_ids[0]


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer   abc  ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert auth.bearer_token(header) == token


def test_subprotocol_token() -> None:
    assert auth.subprotocol_token(["voxserve.v1", "voxserve.bearer.k1"]) == "k1"
    assert auth.subprotocol_token(["voxserve.v1"]) is None
    assert auth.subprotocol_token(["voxserve.bearer."]) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("", False),
        ("10.1.2.3", False),
        ("example.org", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert auth.is_loopback(host) is loopback


def test_keys_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# ops keys\nfile-key  # rotated 2026-01\n\nsha256:" + "0" * 64 + "\n")
    monkeypatch.setenv("VOXSERVE_API_KEYS", "env-a, env-b")
    settings = load_settings(api_keys_file=keys)
    assert [k.get_secret_value() for k in settings.api_keys] == ["env-a", "env-b"]
    ring = KeyRing.from_settings(settings)
    assert len(ring.key_ids) == 4
    for key in ("env-a", "env-b", "file-key"):
        assert ring.verify(key) is not None
    with pytest.raises(ConfigError, match="cannot read API keys file"):
        KeyRing.from_settings(Settings(api_keys_file=tmp_path / "missing"))


def test_non_loopback_needs_keys_or_explicit_insecure() -> None:
    with pytest.raises(ConfigError, match="--insecure-no-auth"):
        auth.check_auth_settings(Settings(host="0.0.0.0", wyoming_port=0))
    assert not auth.check_auth_settings(
        Settings(host="0.0.0.0", wyoming_port=0, insecure_no_auth=True)
    ).enabled
    assert not auth.check_auth_settings(Settings(host="127.0.0.1")).enabled
    keyed = Settings(host="0.0.0.0", api_keys=[SecretStr("k")], wyoming_port=0)
    assert auth.check_auth_settings(keyed).enabled


def test_wyoming_refused_off_loopback_with_keys() -> None:
    settings = Settings(host="0.0.0.0", api_keys=[SecretStr("k")], wyoming_port=10300)
    with pytest.raises(ConfigError, match="Wyoming"):
        auth.check_auth_settings(settings)
    local = Settings(host="127.0.0.1", api_keys=[SecretStr("k")], wyoming_port=10300)
    assert auth.check_auth_settings(local).enabled


@pytest.mark.parametrize(
    ("origin", "host", "allowed", "ok"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", [], True),  # the server's own page
        ("http://evil.example", "127.0.0.1:8000", [], False),
        ("https://app.example", "127.0.0.1:8000", ["https://app.example"], True),
        ("https://app.example", "127.0.0.1:8000", ["https://other.example"], False),
        ("null", "127.0.0.1:8000", [], False),
        ("null", "127.0.0.1:8000", ["*"], True),
    ],
)
def test_origin_allowed(origin: str, host: str, allowed: list[str], ok: bool) -> None:
    assert auth.origin_allowed(origin, host, allowed) is ok
