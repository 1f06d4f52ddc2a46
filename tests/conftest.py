"""Shared fixtures: a real voxserve server on a free loopback port, with the real engines."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from tests import helpers
from tests.fakes import FakeAsr, fake_runtime
from voxserve.config import Settings, load_settings
from voxserve.runtime import Runtime
from voxserve.server.serve import uvicorn_config

# The suite runs on two pytest-xdist workers (scripts/test.sh), then these alone: they judge
# latency, deadlines, pacing or CPU shares, which a second worker's load would distort. A
# whole directory, a file or a test (file::name), by its path under tests/.
SERIAL = (
    # the bench's short real runs (latency bounds, frames at a real-time pace), the pacing
    # of a Realtime client's pieces to 5 ms, a process's CPU share over 0.1 s; the rest of
    # tests/bench is arithmetic on recorded runs and runs beside a neighbour
    "bench/test_smoke.py",
    "bench/test_webrtc_bench.py",
    "bench/test_realtime_client.py",
    "bench/test_procstat.py",
    # TTS saturation by timing (it failed beside a neighbour)
    "cache/test_cache_server.py::test_saturated_tts_answers_from_the_cache",
    "faults/test_clock_faults.py",
    "flow/",
    # 7 slow decodes beside speech and a short transcription, judged against their usual time
    "hostile/test_uploads.py",
    # the soak: 10 s of paced streams and their churn, with its RSS and leak checks, which
    # a neighbour's load disturbs (59 sessions where ~75 run alone, beside two busy workers)
    "memory/test_soak.py",
    "test_bulk_fairness.py",
    "test_scheduling_fairness.py",
    "web/",
    "webrtc/test_calls_e2e.py",
)
# Run on one worker, one file after another: they share something machine-wide. Local Ray
# clusters and forked workers (Ray's ports and /tmp/ray); mDNS on the loopback (port 5353
# shared, a probe's unicast answer reaches one of the programs open: the discovery tests'
# rename needs no other zeroconf program, and `serve` in test_cli advertises by default).
# Every other test server advertises nothing (_no_load_shedding below).
ONE_WORKER = {
    "cluster/": "ray",
    "memory/": "memory",
    "test_cli.py": "zeroconf",
    "transports/test_wyoming_discovery.py": "zeroconf",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark SERIAL tests `serial` (scripts/test.sh runs them apart)."""
    root = Path(__file__).parent
    for item in items:
        path = Path(str(item.path)).relative_to(root).as_posix()
        if f"{path}::{item.nodeid.split('::', 1)[-1]}".startswith(SERIAL):
            item.add_marker(pytest.mark.serial)


def worker_group(nodeid: str) -> str:
    """The xdist work unit of a test: its file (a module's fixtures start once per worker),
    or a ONE_WORKER path's shared resource."""
    path = nodeid.split("::", 1)[0].removeprefix("tests/")
    return next((g for d, g in ONE_WORKER.items() if path.startswith(d)), path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadgroup`, by `worker_group`. Not by `xdist_group` marks: xdist 3.8 files a
    test under its mark by rewriting `item._nodeid`, which pytest 9 no longer reads, so every
    test went to any worker (Ray clusters and mDNS programs side by side) and no group held."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return ByGroup(config, log)


@pytest.fixture(scope="session", autouse=True)
def _private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Servers and CLI subprocesses keep their TTS cache under a temporary $XDG_CACHE_HOME,
    never in the user's ~/.cache (and every test session starts with an empty one)."""
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if previous is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = previous


@pytest.fixture(scope="session", autouse=True)
def _no_load_shedding() -> Iterator[None]:
    """Test servers never refuse uncached speech as degraded: on a busy shared machine real
    engines can be slow for seconds, and tests about engines are not about load shedding.
    Tests of degradation configure it explicitly (tests/cache, tests/flow)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VOXSERVE_TTS__DEGRADE__ENABLED", "false")
        # Nor refuse sessions for load: a test that loads a shared server's stage on purpose
        # would otherwise shed the next test's sessions. tests/flow sets it explicitly.
        patch.setenv("VOXSERVE_FLOW__SHED_AFTER_S", "1000000")
        # Nor refuse a live stream for what streams have cost the ASR engine: on a session's
        # shared server, slow decodes beside other workers made the share say "full", and
        # a test's one stream was closed 1013 at connect (CI, four workers). tests/flow sets it.
        patch.setenv("VOXSERVE_FLOW__ASR_BUSY_LIMIT", "0")
        # Nor refuse a one-shot transcription as predicted past its budget: nine prompted
        # uploads at once were refused 503 four times over beside other workers (CI).
        # tests/flow/test_asr_load.py and tests/test_bulk_uploads.py set their budgets.
        patch.setenv("VOXSERVE_ASR__ONE_SHOT_BUDGET_MS", "600000")
        # Nor advertise their Wyoming port over zeroconf: dozens of test servers on one
        # loopback would probe and rename each other. The discovery tests turn it on.
        patch.setenv("VOXSERVE_WYOMING__ZEROCONF", "false")
        yield


@pytest.fixture(scope="session", autouse=True)
def _no_gc_freeze_in_tests() -> Iterator[None]:
    """In-process test servers do not gc.freeze(): the freeze is process-wide, and in the
    test process it would pin every live object of earlier tests (a stopped server's
    engines) out of the cycle collector for good. Tests of GC control turn it on."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VOXSERVE_GC__FREEZE_AFTER_LOAD", "false")
        yield


free_port = helpers.free_port  # re-exported: tests import it from here


@dataclass
class LiveServer:
    settings: Settings
    runtime: Runtime
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def http_url(self) -> str:
        scheme = "https" if self.settings.tls_cert_file else "http"
        return f"{scheme}://127.0.0.1:{self.settings.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.settings.port}/v1/stream"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.settings.grpc_port}"


def start_server(
    settings: Settings,
    runtime: Runtime | None = None,
    timeout: float = 90.0,
    *,
    grpc_port: int = 0,
    wyoming_port: int = 0,
) -> LiveServer:
    """Start uvicorn in a thread and wait until /readyz says the models are loaded.

    gRPC and Wyoming are off unless a port is given (their defaults would make every test
    server share 50051 and 10300); a runtime passed in gets the same ports."""
    ports = {"grpc_port": grpc_port, "wyoming_port": wyoming_port}
    settings = settings.model_copy(update=ports)
    if runtime is not None:
        runtime.settings = settings
    runtime = runtime or Runtime(settings)
    server = uvicorn.Server(uvicorn_config(settings, runtime))
    thread = threading.Thread(target=server.run, name="voxserve-test-server", daemon=True)
    thread.start()
    live = LiveServer(settings, runtime, server, thread)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ready = httpx.get(f"{live.http_url}/readyz", timeout=1.0, verify=False)
            if ready.status_code == 200:
                return live
        except httpx.HTTPError:
            pass
        if runtime.load_error:
            raise RuntimeError(f"server failed to load engines: {runtime.load_error}")
        time.sleep(0.1)
    raise TimeoutError("server did not become ready")


def stop_server(live: LiveServer) -> None:
    live.server.should_exit = True
    live.thread.join(timeout=10)


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    """One real server with the default engines for the whole test session; its gRPC and
    Wyoming transports are on (tests/transports)."""
    settings = load_settings(port=free_port(), log_level="warning")
    live = start_server(settings, grpc_port=free_port(), wyoming_port=free_port())
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[openai.OpenAI]:
    """The official `openai` SDK on the shared real server (no retries: a test sees the
    first answer). Modules with a `client` of their own (Wyoming) override it."""
    with openai.OpenAI(
        base_url=live_server.http_url + "/v1", api_key="x", max_retries=0, timeout=60.0
    ) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def fake_server() -> Iterator[LiveServer]:
    """A real server on fake engines (ASR answers in 20 ms), for tests about the pipeline."""
    settings = load_settings(port=free_port(), log_level="warning")
    live = start_server(settings, fake_runtime(settings, asr=FakeAsr(delay_s=0.02)))
    yield live
    stop_server(live)


def start_fake_server_in(tmp: Path, **overrides: object) -> LiveServer:
    """A real server on fake engines (tests.fakes), on a free port, with `overrides` of the
    settings and its TTS cache off (its directory under `tmp`); stop it with stop_server."""
    from voxserve.config import CacheConfig

    cache = CacheConfig(dir=tmp, enabled=False)
    settings = load_settings(port=free_port(), log_level="warning", cache=cache, **overrides)
    return start_server(settings, fake_runtime(settings))
