"""Hostile input at the models door (/admin/models: list, pull, remove; issue 36): names of
every hostile class (traversal, absolute paths, home directories, URLs, control characters,
look-alike unicode, lone surrogates, huge, empty, a directory that exists on the server) and
generated ones, bodies past their bounds, many names at once, a pull flood while a live
stream is watched, no or a wrong admin key, a foreign Host, a cross-site form. A real server
(in-process, fake engines, the admin key set) downloads from the stand-in of the Hub
(tests/hub_standin.py); HF_HOME is a temporary directory."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from tests.conftest import LiveServer, start_fake_server_in, stop_server
from tests.hostile.watch import watched
from tests.hub_standin import HubStandin
from tests.models.model_repos import add_whisper_repo
from voxserve.engines.model_store import check_name
from voxserve.server.http.model_pulls import MAX_RUNNING, MAX_WAITING

ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "hostile-models-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
UNSUPPORTED = "unsupported_media_type"
FLOOD = [f"flood-org/model-{n}" for n in range(40)]
HELD_MODEL_BYTES = 700_000  # three of the stand-in's 256 KiB chunks: a hold stops it part way


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    """The stand-in, the flood's repos on it, HF_HOME and HF_ENDPOINT for this module."""
    standin = HubStandin().start()
    for name in FLOOD:
        add_whisper_repo(standin, name, model_bytes=HELD_MODEL_BYTES)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hostile-models-hf")))
        patch.setenv("HF_ENDPOINT", standin.url)
        for name in ("HF_HUB_OFFLINE", "VOXSERVE_OFFLINE", "HF_HUB_CACHE"):
            patch.delenv(name, raising=False)
        yield standin
    standin.stop()


def _start(tmp: Path, admin_key: str | None) -> LiveServer:
    return start_fake_server_in(tmp, admin_key=SecretStr(admin_key) if admin_key else None)


@pytest.fixture(scope="module")
def server(hub: HubStandin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = _start(tmp_path_factory.mktemp("hostile-models"), ADMIN_KEY)
    yield live
    stop_server(live)


def _pull(live: LiveServer, names: Any, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{live.http_url}/admin/models/pull",
        json={"names": names},
        headers={**ADMIN, **headers},
        timeout=10,
    )


def _delete(live: LiveServer, name: str, **headers: str) -> httpx.Response:
    # Every byte escaped, dots too: an HTTP library would resolve "." and ".." segments.
    url = f"{live.http_url}/admin/models/{quote(name, safe='').replace('.', '%2E')}"
    return httpx.delete(url, headers={**ADMIN, **headers}, timeout=10)


def _code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def _states(live: LiveServer) -> list[dict[str, Any]]:
    answer = httpx.get(f"{live.http_url}/admin/models/pull", headers=ADMIN, timeout=10)
    pulls: list[dict[str, Any]] = answer.json()["pulls"]
    return pulls


# -- names ------------------------------------------------------------------------------------

HOSTILE_NAMES = {
    "empty": "",
    "dots": "..",
    "dot": ".",
    "traversal": "../../etc/passwd",
    "traversal-in-repo": "owner/../../etc",
    "dots-in-name": "owner/na..me",
    "absolute": "/etc/passwd",
    "absolute-dir": "/tmp",
    "home": "~/.ssh",
    "home-user": "~root",
    "three-parts": "a/b/c",
    "double-slash": "owner//name",
    "no-name": "owner/",
    "no-owner": "/name",
    "windows": "C:\\Windows\\System32",
    "url": "http://evil.example/owner/name",
    "file-url": "file:///etc/passwd",
    "hf-url": "hf://owner/name",
    "query": "owner/name?revision=evil",
    "fragment": "owner/name#x",
    "percent": "%2e%2e%2fetc",
    "nul": "small.en\x00",
    "newline": "small.en\nX-Injected: 1",
    "space": " small.en",
    "tab": "small\t.en",
    "fullwidth": "ｓｍａｌｌ.ｅｎ",
    "cyrillic": "sm\u0430ll.en",  # a Cyrillic a: the look-alike is the point
    "cjk": "名前/モデル",
    "emoji": "🎤/whisper",
    "rtl-override": "small\u202e.en",
    "leading-dash": "-rf",
    "leading-dot": ".hidden",
    "trailing-dot": "owner/name.",
    "long": "a" * 201,
    "long-part": "a" * 97 + "/b",
    "very-long": "x" * 5000,
}


@pytest.mark.parametrize("name", list(HOSTILE_NAMES.values()), ids=list(HOSTILE_NAMES))
def test_hostile_names_are_refused_before_any_lookup(
    server: LiveServer, hub: HubStandin, name: str
) -> None:
    seen, pulls = len(hub.requests), len(_states(server))
    pulled = _pull(server, [name])
    assert pulled.status_code == 400, pulled.text
    assert _code(pulled) == "invalid_parameter"
    assert len(pulled.text) < 1000  # the name is quoted short, never echoed whole
    deleted = _delete(server, name)
    if "\n" in name:  # no route matches a path with a line break: Starlette's plain 404
        assert (deleted.status_code, deleted.text) == (404, "Not Found")
    else:
        assert (deleted.status_code, _code(deleted)) == (400, "invalid_parameter"), deleted.text
    assert len(hub.requests) == seen and len(_states(server)) == pulls


@pytest.mark.parametrize("name", ["voxserve", "tests/fixtures", "docs"])
def test_a_directory_on_the_server_is_not_a_model(server: LiveServer, name: str) -> None:
    """Well-formed names that are directories in the server's working directory: a local
    path is a config file's choice, never the network's: not found, nothing touched."""
    before = sorted(p.name for p in (ROOT / name).iterdir())
    pulled = _pull(server, [name])
    assert (pulled.status_code, _code(pulled)) == (404, "model_not_found"), pulled.text
    deleted = _delete(server, name)
    assert (deleted.status_code, _code(deleted)) == (404, "model_not_found"), deleted.text
    assert sorted(p.name for p in (ROOT / name).iterdir()) == before


def test_a_raw_traversal_path_is_refused(server: LiveServer) -> None:
    """The DELETE path as a raw client sends it, not normalised by an HTTP library."""
    for path in (b"/admin/models/../../etc/passwd", b"/admin/models/%2e%2e/%2e%2e/etc"):
        request = (
            b"DELETE " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\nConnection: close\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", server.settings.port), timeout=5) as sock:
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 404")), answer[:200]
        assert b"freed_bytes" not in answer
    assert Path("/etc/passwd").is_file()


_NOT_NAMES = st.text(max_size=300).filter(lambda text: not _well_formed(text))


def _well_formed(text: str) -> bool:
    try:
        check_name(text, allow_local=False)
    except ValueError:
        return False
    return True


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=_NOT_NAMES)
def test_generated_names_are_refused(server: LiveServer, hub: HubStandin, name: str) -> None:
    seen = len(hub.requests)
    pulled = _pull(server, [name])
    assert pulled.status_code == 400, pulled.text
    # A lone surrogate is not JSON a server can read as text: refused as the message.
    assert _code(pulled) in ("invalid_parameter", "invalid_message"), pulled.text
    assert len(hub.requests) == seen


# -- bodies -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        ({"names": [f"org/m{n}" for n in range(17)]}, "application/json", 400, "invalid_parameter"),
        ({"names": []}, "application/json", 400, "invalid_parameter"),
        ({"names": "small.en"}, "application/json", 400, "invalid_parameter"),
        ({"names": {"small.en": 1}}, "application/json", 400, "invalid_parameter"),
        ({"names": [1, 2]}, "application/json", 400, "invalid_parameter"),
        ({"names": [["small.en"]]}, "application/json", 400, "invalid_parameter"),
        ({"names": [None]}, "application/json", 400, "invalid_parameter"),
        ({}, "application/json", 400, "invalid_parameter"),
        ({"names": ["x" * 20_000]}, "application/json", 413, "message_too_large"),
        ({"names": ["small.en"]}, "text/plain", 415, "unsupported_media_type"),
        (
            {"names": ["small.en"]},
            "application/x-www-form-urlencoded",
            415,
            "unsupported_media_type",
        ),
    ],
    ids=[
        "17-names",
        "none",
        "string",
        "object",
        "numbers",
        "nested",
        "null",
        "no-names",
        "huge",
        "text-plain",
        "form",
    ],
)
def test_bodies_out_of_bounds_are_refused_whole(
    server: LiveServer, hub: HubStandin, body: Any, content_type: str, status: int, code: str
) -> None:
    seen = len(hub.requests)
    answer = httpx.post(
        f"{server.http_url}/admin/models/pull",
        content=json.dumps(body).encode(),
        headers={**ADMIN, "Content-Type": content_type},
        timeout=10,
    )
    assert (answer.status_code, _code(answer)) == (status, code), answer.text
    assert len(hub.requests) == seen


def test_deep_json_is_refused(server: LiveServer) -> None:
    body = b'{"names": ' + b"[" * 200 + b"]" * 200 + b"}"
    answer = httpx.post(
        f"{server.http_url}/admin/models/pull",
        content=body,
        headers={**ADMIN, "Content-Type": "application/json"},
        timeout=10,
    )
    assert (answer.status_code, _code(answer)) == (400, "invalid_json"), answer.text


# -- the flood --------------------------------------------------------------------------------


async def test_a_pull_flood_is_bounded_and_costs_the_live_stream_nothing(
    server: LiveServer, hub: HubStandin
) -> None:
    """Pulls held mid-download by the stand-in: two run, sixteen wait, the rest of the flood
    is refused at once (503, Retry-After); a name already pulling is that pull, not a
    second; a model being pulled is not removed. Released, every accepted pull completes,
    each file fetched once."""
    capacity = MAX_RUNNING + MAX_WAITING
    hub.hold(after_bytes=1)
    try:
        async with watched(server.http_url) as watch:
            async with httpx.AsyncClient(base_url=server.http_url, headers=ADMIN) as http:
                first = await http.post("/admin/models/pull", json={"names": FLOOD[:16]})
                assert first.status_code == 202, first.text
                assert hub.wait_held(10)
                # Sixteen more in one request do not fit: refused whole, nothing queued.
                whole = await http.post("/admin/models/pull", json={"names": FLOOD[16:32]})
                assert (whole.status_code, _code(whole)) == (503, "overloaded"), whole.text
                assert int(whole.headers["retry-after"]) > 0
                # A flood of single names at once: exactly the room left is taken.
                singles = await asyncio.gather(
                    *(http.post("/admin/models/pull", json={"names": [n]}) for n in FLOOD[16:])
                )
                codes = sorted(a.status_code for a in singles)
                assert codes.count(202) == capacity - 16, codes
                assert codes.count(503) == len(singles) - (capacity - 16), codes
                # The same names again: the pulls in flight, not new ones.
                repeat = await http.post("/admin/models/pull", json={"names": FLOOD[:16]})
                assert repeat.status_code == 202, repeat.text
                assert {p["state"] for p in repeat.json()["pulls"]} <= {"running", "queued"}
                states = (await http.get("/admin/models/pull")).json()["pulls"]
                running = [s for s in states if s["state"] == "running"]
                assert len(running) == MAX_RUNNING, states
                assert len([s for s in states if s["state"] == "queued"]) == capacity - 2
                busy = await http.delete(f"/admin/models/{running[0]['name']}")
                assert (busy.status_code, _code(busy)) == (409, "model_not_removable")
                # The door answers the others while the flood waits.
                listed = await http.get("/admin/models")
                assert listed.status_code == 200
                hub.release()
                deadline = time.monotonic() + 60
                while True:
                    states = (await http.get("/admin/models/pull")).json()["pulls"]
                    if not any(s["state"] in ("queued", "running") for s in states):
                        break
                    assert time.monotonic() < deadline, states
                    await asyncio.sleep(0.1)
        done = [s["name"] for s in states if s["state"] == "done"]
        assert len(done) == capacity and set(done) <= set(FLOOD), states
        for name in FLOOD:  # each accepted model fetched once (one pull per name), no other
            gets = [p for m, p in hub.requests if m == "GET" and p.startswith(f"/lfs/{name}/")]
            assert len(gets) == (1 if name in done else 0), (name, gets)
    finally:
        hub.release()
    watch.assert_unhurt(max_growth_mb=80)


# -- keys, Host, Origin -----------------------------------------------------------------------

NEVER = "keyless-org/never-pulled"
ROUTES = [
    ("GET", "/admin/models", None),
    ("GET", "/admin/models/pull", None),
    ("POST", "/admin/models/pull", {"names": [NEVER]}),
    ("DELETE", f"/admin/models/{NEVER}", None),
]
WRONG_KEYS = {
    "none": None,
    "wrong": "Bearer not-the-key",
    "longer": f"Bearer {ADMIN_KEY}x",
    "prefix": f"Bearer {ADMIN_KEY[:-1]}",
    "basic": f"Basic {ADMIN_KEY}",
    "bare": ADMIN_KEY,
    "empty": "Bearer",
    "api-key-scheme": f"Token {ADMIN_KEY}",
}


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_no_or_a_wrong_admin_key_is_refused(
    server: LiveServer, hub: HubStandin, method: str, path: str, body: Any
) -> None:
    seen = len(hub.requests)
    for what, authorization in WRONG_KEYS.items():
        headers = {} if authorization is None else {"Authorization": authorization}
        answer = httpx.request(
            method, f"{server.http_url}{path}", json=body, headers=headers, timeout=10
        )
        assert (answer.status_code, _code(answer)) == (401, "unauthorized"), what
        assert answer.headers["www-authenticate"] == "Bearer"
    assert len(hub.requests) == seen
    assert all(s["name"] != NEVER for s in _states(server))


def test_without_an_admin_key_configured_the_door_is_shut(hub: HubStandin, tmp_path: Path) -> None:
    live = _start(tmp_path, None)
    try:
        for method, path, body in ROUTES:
            answer = httpx.request(
                method, f"{live.http_url}{path}", json=body, headers=ADMIN, timeout=10
            )
            assert (answer.status_code, _code(answer)) == (403, "admin_disabled"), path
    finally:
        stop_server(live)


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_a_foreign_host_or_a_cross_site_page_is_refused(
    server: LiveServer, hub: HubStandin, method: str, path: str, body: Any
) -> None:
    seen = len(hub.requests)
    url = f"{server.http_url}{path}"
    rebound = httpx.request(
        method,
        url,
        json=body,
        headers={**ADMIN, "Host": "evil.example:8000", "Origin": "http://evil.example:8000"},
        timeout=10,
    )
    assert (rebound.status_code, _code(rebound)) == (403, "host_not_allowed")
    # A page of another site sends no admin key (a header needs a CORS preflight, which no
    # origin passes) and, without a preflight, no JSON content type.
    page = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    keyless = httpx.request(method, url, content=json.dumps(body or {}), headers=page, timeout=10)
    assert (keyless.status_code, _code(keyless)) == (401, "unauthorized")
    if method == "POST":
        simple = httpx.request(
            method, url, content=json.dumps(body), headers={**page, **ADMIN}, timeout=10
        )
        assert (simple.status_code, _code(simple)) == (415, "unsupported_media_type")
    preflight = httpx.options(
        url,
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": method},
        timeout=10,
    )
    assert "access-control-allow-origin" not in preflight.headers
    assert len(hub.requests) == seen


def test_the_door_writes_nothing_outside_the_model_cache(server: LiveServer) -> None:
    """After every attack above: HF_HOME holds the cache only, the working directory is
    as it was (no file a name could have made)."""
    home = Path(os.environ["HF_HOME"])
    assert {p.name for p in home.iterdir()} <= {"hub", "xet"}, list(home.iterdir())
    hub = home / "hub"  # absent when no pull got as far as the cache (none need to)
    repos = (
        {p.name for p in hub.iterdir() if p.name.startswith("models--")} if hub.is_dir() else set()
    )
    assert repos <= {"models--" + name.replace("/", "--") for name in FLOOD}, repos
