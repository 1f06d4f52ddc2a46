"""The model pulls a server runs for `POST /admin/models/pull`: one per name at a time, at
most `max_running` downloading at once and `max_waiting` queued behind them (a flood of
pull requests is refused, not queued without bound), the last `keep_finished` outcomes kept
for `GET /admin/models/pull`.

A pull runs as a child process (`voxserve models pull --json-lines NAME`), watched by a
daemon thread of its own: a download takes minutes, and its transfer, hashing and first
imports in the server's own interpreter took the GIL from the event loop (a live stream's
ping round trip reached 360 ms beside a flood of pulls run in threads). The child reads the
same environment (HF_HOME, HF_ENDPOINT, the offline flags) and writes progress and its
outcome as JSON lines. A server that exits mid-pull leaves the child to finish (or the Hub
cache's partial file, which the next pull resumes).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from voxserve.errors import shortened

if TYPE_CHECKING:
    from voxserve.engines.hub import Progress

log = logging.getLogger(__name__)

MAX_RUNNING = 2  # downloads at once: each can fill the link; more only share it
MAX_WAITING = 16  # queued behind them; past that a request is refused (overloaded)
KEEP_FINISHED = 32  # outcomes GET /admin/models/pull still shows
MAX_ERROR_CHARS = 300
MAX_LINE_BYTES = 64 * 1024  # a child's JSON line; longer is not one of ours

Job = Callable[[Callable[["Progress"], None]], bool]
"""A pull: called with a progress callback in the pull's thread; True if it downloaded,
False if everything was there already; raises on failure."""


class PullsFull(Exception):
    """More pulls than the board runs and queues: the request is refused whole."""


@dataclass
class PullState:
    name: str
    state: str = "queued"  # queued | running | done | failed
    done_bytes: int = 0
    total_bytes: int = 0
    fetched: bool = False
    error: str | None = None
    queued_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class PullBoard:
    def __init__(
        self,
        *,
        max_running: int = MAX_RUNNING,
        max_waiting: int = MAX_WAITING,
        keep_finished: int = KEEP_FINISHED,
    ) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._active: dict[str, PullState] = {}  # queued or running, by name
        self._waiting: deque[tuple[PullState, Job]] = deque()
        self._running = 0
        self._finished: deque[PullState] = deque(maxlen=keep_finished)

    def submit(self, jobs: Sequence[tuple[str, Job | None]]) -> list[PullState]:
        """Queue each (name, job) whose name is not already being pulled; None as the job:
        nothing to fetch (a packaged model), done at once. All or none: PullsFull if the
        new ones do not fit."""
        started: list[tuple[PullState, Job]] = []
        answer: list[PullState] = []
        with self._lock:
            new = [(n, j) for n, j in dict(jobs).items() if n not in self._active]
            needed = sum(1 for _, job in new if job is not None)
            if len(self._waiting) + self._running + needed > self.max_running + self.max_waiting:
                raise PullsFull(
                    f"{self._running} model pulls running and {len(self._waiting)} queued "
                    f"(at most {self.max_running} and {self.max_waiting}); try again later"
                )
            for name, job in new:
                state = PullState(name)
                if job is None:
                    state.state, state.finished_at = "done", time.time()
                    self._finished.append(state)
                    continue
                self._active[name] = state
                if self._running < self.max_running:
                    self._running += 1
                    state.state = "running"
                    started.append((state, job))
                else:
                    self._waiting.append((state, job))
            for name, _ in dict(jobs).items():
                found = self._active.get(name) or self._last_finished(name)
                if found is not None:
                    answer.append(found)
        for state, job in started:
            threading.Thread(
                target=self._work, args=(state, job), name="voxserve-model-pull", daemon=True
            ).start()
        return answer

    def pulling(self, name: str) -> bool:
        with self._lock:
            return name in self._active

    def states(self) -> list[dict[str, Any]]:
        """Pulls in flight (running, then queued), then the latest outcomes, newest first."""
        with self._lock:
            active = sorted(
                self._active.values(), key=lambda s: (s.state != "running", s.queued_at)
            )
            return [s.as_dict() for s in (*active, *reversed(self._finished))]

    def _last_finished(self, name: str) -> PullState | None:
        return next((s for s in reversed(self._finished) if s.name == name), None)

    def _work(self, state: PullState, job: Job) -> None:
        """Run `job`, then whatever waits, until nothing does (one thread per slot)."""
        current: tuple[PullState, Job] | None = (state, job)
        while current is not None:
            self._run(*current)
            with self._lock:
                if self._waiting:
                    current = self._waiting.popleft()
                    current[0].state = "running"
                else:
                    current = None
                    self._running -= 1

    def _run(self, state: PullState, job: Job) -> None:
        def on_progress(progress: Progress) -> None:
            state.done_bytes, state.total_bytes = progress.done_bytes, progress.total_bytes

        try:
            state.fetched = job(on_progress)
        except Exception as exc:
            text = " ".join((str(exc) or type(exc).__name__).split())
            state.error = shortened(text, MAX_ERROR_CHARS)
            state.state = "failed"
            log.warning(
                "model pull failed", extra={"model": state.name, "error": type(exc).__name__}
            )
        else:
            state.state = "done"
        state.finished_at = time.time()
        with self._lock:
            self._active.pop(state.name, None)
            self._finished.append(state)


class PullFailed(RuntimeError):
    """The child's one-line reason (or its exit status)."""


def child_pull(name: str, repo_id: str, *, offline: bool) -> Job:
    """The pull of `name` as a child process (see the module's docstring)."""

    def run(on_progress: Callable[[Progress], None]) -> bool:
        from voxserve.engines.hub_progress import Progress

        command = [sys.executable, "-m", "voxserve", "models", "pull", "--json-lines", name]
        env = {**os.environ, **({"VOXSERVE_OFFLINE": "1"} if offline else {})}
        fetched: bool | None = None
        error: str | None = None
        with subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        ) as child:
            assert child.stdout is not None
            while line := child.stdout.readline(MAX_LINE_BYTES):
                try:
                    said = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(said, dict):
                    continue
                if "error" in said:
                    error = str(said["error"])
                elif "fetched" in said:
                    fetched = bool(said["fetched"])
                elif "done_bytes" in said:
                    done, total = int(said["done_bytes"]), int(said.get("total_bytes") or 0)
                    on_progress(Progress(name, repo_id, done, total))
            status = child.wait()
        if error is not None or fetched is None:
            raise PullFailed(error or f"the pull ended with exit status {status}")
        return fetched

    return run
