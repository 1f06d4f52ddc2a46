"""`voxserve serve --workers N`: N server processes on one listening socket, models shared.

The parent binds the port, loads the engines that are safe to fork (below), runs one full
collection and `gc.freeze()`, and forks N workers *before any other thread starts*. The
workers inherit the loaded weights copy-on-write: the pages stay shared as long as nobody
writes them (model weights are read-only; frozen objects are not scanned by the collector).
Each worker then loads the remaining engines itself and runs the usual server on the
inherited socket (the kernel spreads accepted connections over the workers).

Fork safety is measured, not assumed: a library that started threads in the parent has
none in the child, and a call that waits for them hangs. CTranslate2 (whisper) does that
(its replica worker thread): a forked child's first transcription never returns. silero,
piper, espeak and the load engines run on the calling thread (onnxruntime with one intra-op
thread starts no pool), so they work in a child (tests/memory/test_workers.py forks and
calls each). Each engine class declares it (`fork_safe = True`, engines/base.py): this
module knows no engine by name.

The parent only supervises: a worker that dies is started again (after a pause if it dies
young), SIGTERM/SIGINT are forwarded to the workers (each drains and exits 0) and the parent
exits 0 when they all did, SIGHUP is forwarded (each worker hot-reloads its engines).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from voxserve.config import ConfigError, EngineSpec, Settings
from voxserve.engines.base import fork_safe as declares_fork_safe
from voxserve.engines.registry import EngineConfigError, engine_class
from voxserve.observe import gc_control

log = logging.getLogger(__name__)

RESTART_PAUSE_S = 1.0  # a worker that dies within this of its start waits this long
CONFIG_ERROR_EXIT = 2  # a worker's engines are misconfigured: stop, do not restart
MAX_QUICK_DEATHS = 5  # in a row: the workers cannot start; give up (exit 1)

WorkerMain = Callable[[Settings, dict[str, Any], int], int]


def fork_safe(kind: str, name: str) -> bool:
    """What the engine class declares (engines/base.py `fork_safe`)."""
    return declares_fork_safe(engine_class(kind, name))


def preload_engines(settings: Settings) -> dict[str, Any]:
    """Build the fork-safe engines in the parent ("vad", "asr", "tts.NAME", "responder"),
    for `load_engines(preloaded=...)` in every worker."""
    from voxserve.engines.loaded import build_engine

    cfg = settings.engines
    specs: list[tuple[str, str, EngineSpec]] = [
        ("vad", "vad", cfg.vad),
        ("asr", "asr", cfg.asr),
        *[("tts", f"tts.{spec.name}", spec) for spec in cfg.tts],
        ("responder", "responder", cfg.responder),
    ]
    loaded: dict[str, Any] = {}
    for kind, key, spec in specs:
        if not fork_safe(kind, spec.name):
            log.info("engine loaded in each worker (not fork-safe)", extra={"engine": key})
            continue
        parallel = settings.pipeline.asr.concurrency if kind == "asr" else None
        loaded[key], seconds = build_engine(kind, spec, cfg.default_threads, parallel)
        log.info(
            "engine loaded before fork (shared)",
            extra={"engine": key, "seconds": round(seconds, 3)},
        )
    return loaded


def worker_settings(settings: Settings, index: int) -> Settings:
    """Each worker's TTS cache in its own directory (one server per cache directory); the
    client-secret store in the one directory they all share (a secret minted by one worker
    is redeemed by another)."""
    shared = settings.cache.path().parent
    cache = settings.cache.model_copy(update={"dir": shared / f"worker-{index}"})
    realtime = settings.realtime.model_copy(
        update={"secrets_dir": settings.realtime.secrets_dir or shared}
    )
    return settings.model_copy(update={"cache": cache, "realtime": realtime, "workers": 1})


class Supervisor:
    """Forks the workers and keeps them running until told to stop."""

    def __init__(
        self, settings: Settings, count: int, preloaded: dict[str, Any], main: WorkerMain
    ) -> None:
        self.settings = settings
        self.count = count
        self.preloaded = preloaded
        self.main = main
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (index, started)
        self.stopping = False
        self.failed = False
        self.quick_deaths = 0
        self.config_error: str | None = None
        # A worker's EngineConfigError (found while loading its own engines): its line,
        # read by the parent, which stops every worker and raises it once.
        self._config_errors = os.pipe()

    def _spawn(self, index: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the supervisor's code
            code = 1
            try:
                # Its own process group: a terminal's Ctrl-C reaches the parent only, which
                # forwards it once (a second SIGINT would cut a worker's drain short).
                os.setpgid(0, 0)
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                # SIGHUP's default would kill a worker still starting; the app installs the
                # reload handler once it runs (a worker still loading loads new files anyway).
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
                code = self.main(worker_settings(self.settings, index), self.preloaded, index)
            except EngineConfigError as exc:  # the parent says it once and exits 2
                os.write(self._config_errors[1], f"{exc}\n".encode())
                code = CONFIG_ERROR_EXIT
            except BaseException:
                log.exception("worker failed", extra={"worker": index})
            finally:
                logging.shutdown()
                os._exit(code)
        self.children[pid] = (index, time.monotonic())
        log.info("worker started", extra={"worker": index, "pid": pid})

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def run(self) -> int:
        """Start the workers and supervise them; 0 when they all stopped cleanly."""
        if threading.active_count() > 1:
            log.warning("threads running before fork", extra={"threads": threading.active_count()})
        previous = {
            sig: signal.signal(sig, self._forward)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        codes: list[int] = []
        try:
            for index in range(self.count):
                self._spawn(index)
            while self.children:
                pid, status = os.waitpid(-1, 0)
                if pid not in self.children:
                    continue
                index, started = self.children.pop(pid)
                code = os.waitstatus_to_exitcode(status)
                if code == CONFIG_ERROR_EXIT and self.config_error is None:
                    self._config_failed()
                if self.stopping or self.failed:
                    codes.append(code)
                    continue
                self._restart(index, started, code)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for fd in self._config_errors:
                os.close(fd)
        if self.config_error is not None:
            raise ConfigError(self.config_error)
        if self.failed:
            return 1
        return 0 if all(code == 0 for code in codes) else 1

    def _config_failed(self) -> None:
        """A worker found a bad engine option: stop them all (the others would find it too)."""
        os.set_blocking(self._config_errors[0], False)
        try:
            line = os.read(self._config_errors[0], 4096).decode(errors="replace")
        except BlockingIOError:
            line = ""
        self.config_error = line.splitlines()[0] if line else "a worker's engines are misconfigured"
        self.failed = True
        self._forward(signal.SIGTERM, None)

    def _restart(self, index: int, started: float, code: int) -> None:
        log.error("worker exited; starting it again", extra={"worker": index, "code": code})
        young = time.monotonic() - started < RESTART_PAUSE_S
        self.quick_deaths = self.quick_deaths + 1 if young else 0
        if self.quick_deaths >= MAX_QUICK_DEATHS:
            log.error("workers keep dying at start; stopping", extra={"worker": index})
            self.failed = True
            self._forward(signal.SIGTERM, None)
            return
        if young:
            time.sleep(RESTART_PAUSE_S)
        if not self.stopping:
            self._spawn(index)


def serve_workers(
    settings: Settings, count: int, sockets: list[socket.socket], main: WorkerMain
) -> int:
    """Preload, freeze, fork `count` workers running `main(settings, preloaded, index)`."""
    preloaded = preload_engines(settings)
    gc_control.after_load(settings.gc)  # freeze before fork: the pages stay shared
    for sock in sockets:
        sock.set_inheritable(True)
    return Supervisor(settings, count, preloaded, main).run()
