"""Structured logs: JSON lines with the session's ids from context, and no audio in them."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from voxserve.observe.logs import (
    VoxHandler,
    bind_session,
    configure_logging,
    current_trace,
    trace_context,
)


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """Configure logging into a buffer; restore the previous logging state afterwards."""
    root = logging.getLogger()
    saved_level = root.level
    saved_handlers = list(root.handlers)
    uvicorn_saved = {
        name: (lg.level, lg.propagate, list(lg.handlers))
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "test.quiet")
        for lg in [logging.getLogger(name)]
    }
    buffer = io.StringIO()
    yield buffer
    for handler in list(root.handlers):
        if isinstance(handler, VoxHandler):
            root.removeHandler(handler)
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)
    for name, (level, propagate, handlers) in uvicorn_saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = propagate
        logger.handlers[:] = handlers
    logging.captureWarnings(False)


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]


def test_json_line_has_the_base_fields_and_extras(stream: io.StringIO) -> None:
    configure_logging("info", stream=stream)
    logging.getLogger("voxserve.test").info(
        "turn done in %d ms", 42, extra={"stage": "asr", "n": 3}
    )
    [line] = lines(stream)
    assert line["level"] == "info"
    assert line["logger"] == "voxserve.test"
    assert line["msg"] == "turn done in 42 ms"
    assert line["stage"] == "asr" and line["n"] == 3
    assert line["ts"].endswith("Z") and "T" in line["ts"]
    assert "trace_id" not in line and "session_id" not in line


def test_trace_context_ids_are_on_every_line_inside_and_gone_after(stream: io.StringIO) -> None:
    configure_logging("info", stream=stream)
    log = logging.getLogger("voxserve.test")
    with trace_context("trace-1", "sess-1"):
        log.info("first")
        logging.getLogger("other.library").warning("second")
        assert current_trace() == ("trace-1", "sess-1")
    log.info("outside")
    first, second, outside = lines(stream)
    assert (first["trace_id"], first["session_id"]) == ("trace-1", "sess-1")
    assert (second["trace_id"], second["session_id"]) == ("trace-1", "sess-1")
    assert "trace_id" not in outside and current_trace() == (None, None)


async def test_bind_session_stays_inside_its_own_task(stream: io.StringIO) -> None:
    """Concurrent sessions each log their own ids (contextvars are per task)."""
    configure_logging("info", stream=stream)
    log = logging.getLogger("voxserve.session")

    async def session(n: int) -> None:
        bind_session(f"trace-{n}", f"sess-{n}")
        for step in range(3):
            log.info("step", extra={"n": n, "step": step})
            await asyncio.sleep(0)

    await asyncio.gather(*(session(n) for n in range(4)))
    log.info("after")
    found = lines(stream)
    assert len(found) == 13
    for line in found[:-1]:
        assert line["trace_id"] == f"trace-{line['n']}"
        assert line["session_id"] == f"sess-{line['n']}"
    assert "trace_id" not in found[-1]


def test_explicit_extra_ids_win_over_the_context(stream: io.StringIO) -> None:
    configure_logging("info", stream=stream)
    with trace_context("ctx-trace", "ctx-session"):
        logging.getLogger("t").info("x", extra={"trace_id": "own", "session_id": "mine"})
    [line] = lines(stream)
    assert (line["trace_id"], line["session_id"]) == ("own", "mine")


def test_audio_bytes_and_arrays_are_never_dumped(stream: io.StringIO) -> None:
    configure_logging("debug", stream=stream)
    audio = b"\x01\x02" * 50
    log = logging.getLogger("voxserve.test")
    log.debug("got %s from %s", audio, "client")
    log.debug("frame %r", bytearray(640))
    log.debug("named %(pcm)s", {"pcm": memoryview(audio)})
    log.debug(
        "extras", extra={"pcm": audio, "chunks": [b"abc"], "samples": np.zeros(320, np.int16)}
    )
    raw = stream.getvalue()
    assert "\\u0001" not in raw and "x01" not in raw
    first, second, third, fourth = lines(stream)
    assert first["msg"] == "got <100 bytes> from client"
    assert second["msg"] == "frame <640 bytes>"
    assert third["msg"] == "named <100 bytes>"
    assert fourth["pcm"] == "<100 bytes>"
    assert fourth["chunks"] == ["<3 bytes>"]
    assert fourth["samples"] == "<array shape=(320,) dtype=int16>"


def test_exceptions_are_one_json_line_with_the_traceback(stream: io.StringIO) -> None:
    configure_logging("info", stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("t").exception("failed")
    [line] = stream.getvalue().splitlines()
    parsed = json.loads(line)
    assert parsed["level"] == "error"
    assert "RuntimeError: boom" in parsed["exc"]


def test_levels_and_module_levels(stream: io.StringIO) -> None:
    configure_logging("warning", module_levels={"test.quiet": "error"}, stream=stream)
    logging.getLogger("test.loud").info("dropped: below warning")
    logging.getLogger("test.loud").warning("kept")
    logging.getLogger("test.quiet").warning("dropped: module level is error")
    assert [line["msg"] for line in lines(stream)] == ["kept"]
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("loud", stream=stream)


def test_reconfiguring_replaces_the_handler_and_routes_uvicorn(stream: io.StringIO) -> None:
    """uvicorn installs its own handlers; configure_logging (run after it) takes them over."""
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.addHandler(logging.StreamHandler(io.StringIO()))
    uvicorn_logger.propagate = False
    configure_logging("info", stream=io.StringIO())
    configure_logging("info", stream=stream)
    assert sum(isinstance(h, VoxHandler) for h in logging.getLogger().handlers) == 1
    with trace_context("t-1", "s-1"):
        logging.getLogger("uvicorn.error").info("Started server process [%d]", 123)
    [line] = lines(stream)
    assert line["logger"] == "uvicorn.error"
    assert line["msg"] == "Started server process [123]"
    assert line["trace_id"] == "t-1"


def test_access_log_switched_off_by_uvicorn_stays_off(stream: io.StringIO) -> None:
    access = logging.getLogger("uvicorn.access")
    access.handlers[:] = []
    access.propagate = False  # what uvicorn does for access_log=False
    configure_logging("info", stream=stream)
    access.info('127.0.0.1:1 - "GET /readyz HTTP/1.1" 200')
    assert lines(stream) == []


def test_text_format_carries_the_same_fields(stream: io.StringIO) -> None:
    configure_logging("info", json_format=False, stream=stream)
    with trace_context("t-9", "s-9"):
        logging.getLogger("voxserve.x").info("sent %s", b"\x00" * 8, extra={"seq": 7})
    text = stream.getvalue()
    assert "info" in text and "voxserve.x: sent <8 bytes>" in text
    assert "seq=7" in text and 'trace_id="t-9"' in text and 'session_id="s-9"' in text
