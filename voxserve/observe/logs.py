"""Structured logging: one JSON object per line on stderr, with the session's ids attached.

Log lines are the way to follow one session through a server carrying hundreds, so every
line logged while a session runs carries its `trace_id` and `session_id`, taken from
contextvars (each asyncio task has its own copy, so concurrent sessions never mix ids).
Audio must never reach a log: bytes-like values and arrays are rendered as their size only.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import logging
import sys
import traceback
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

TRACE_LEVEL = 5
"""uvicorn's extra level below DEBUG; accepted here so `--log-level trace` means the same."""

LEVELS: dict[str, int] = {
    "critical": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": TRACE_LEVEL,
}

# uvicorn configures these with its own handlers; they are routed through ours instead.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")

_trace_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "voxserve_trace_id", default=None
)
_session_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "voxserve_session_id", default=None
)

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
) | {"message", "asctime", "taskName", "trace_id", "session_id", "color_message"}


def parse_level(level: str | int) -> int:
    """A level name (any case) or number; ValueError names the valid ones."""
    if isinstance(level, int):
        return level
    found = LEVELS.get(level.strip().lower())
    if found is None:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(LEVELS)}")
    return found


# --- trace context --------------------------------------------------------------------------


@contextlib.contextmanager
def trace_context(trace_id: str | None, session_id: str | None = None) -> Iterator[None]:
    """Attach the ids to every line logged inside the block (restored afterwards)."""
    trace_token = _trace_id.set(trace_id)
    session_token = _session_id.set(session_id)
    try:
        yield
    finally:
        _session_id.reset(session_token)
        _trace_id.reset(trace_token)


def bind_session(trace_id: str | None, session_id: str | None = None) -> None:
    """Attach the ids for the rest of the current context (e.g. a session's own task)."""
    _trace_id.set(trace_id)
    _session_id.set(session_id)


def current_trace() -> tuple[str | None, str | None]:
    """The (trace_id, session_id) the next log line would carry."""
    return _trace_id.get(), _session_id.get()


class ContextFilter(logging.Filter):
    """Copies the context's ids onto the record, unless `extra=` already set them.

    Runs on the handler, in the thread that logs, so it sees that thread's context."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trace_id", None) is None:
            record.trace_id = _trace_id.get()
        if getattr(record, "session_id", None) is None:
            record.session_id = _session_id.get()
        return True


# --- rendering ------------------------------------------------------------------------------


class Redacted(str):
    """What stands in for audio; its repr is itself, so `%r` shows `<640 bytes>` too."""

    def __repr__(self) -> str:
        return str(self)


def redact(value: Any) -> Any:
    """Replace audio-like values (bytes, arrays) with a size description; keep the rest."""
    if isinstance(value, memoryview):
        return Redacted(f"<{value.nbytes} bytes>")
    if isinstance(value, bytes | bytearray):
        return Redacted(f"<{len(value)} bytes>")
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return Redacted(f"<array shape={tuple(shape)} dtype={dtype}>")
    return value


def _message(record: logging.LogRecord) -> str:
    """record.getMessage() with bytes/array args redacted before they are %-formatted."""
    msg = str(record.msg)
    args = record.args
    if not args:
        return msg
    if isinstance(args, Mapping):
        safe: Any = {key: redact(value) for key, value in args.items()}
    else:
        safe = tuple(redact(value) for value in args)
    try:
        return str(msg % safe)
    except (TypeError, ValueError, KeyError):
        return f"{msg} {safe!r}"


def _jsonable(value: Any) -> Any:
    value = redact(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return str(value)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        key: _jsonable(value)
        for key, value in vars(record).items()
        if key not in _RECORD_ATTRS and not key.startswith("_")
    }


def _timestamp(record: logging.LogRecord) -> str:
    when = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _level_name(record: logging.LogRecord) -> str:
    return "trace" if record.levelno == TRACE_LEVEL else record.levelname.lower()


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", ...extra, "trace_id", "session_id", "exc"}` per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": _level_name(record),
            "logger": record.name,
            "msg": _message(record),
        }
        for key, value in _extras(record).items():
            line.setdefault(key, value)
        trace_id = getattr(record, "trace_id", None)
        session_id = getattr(record, "session_id", None)
        if trace_id is not None:
            line["trace_id"] = trace_id
        if session_id is not None:
            line["session_id"] = session_id
        if record.exc_info:
            line["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """Human-readable: `ts level logger: msg key=value ...` (same fields as the JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = _extras(record)
        for key in ("trace_id", "session_id"):
            value = getattr(record, key, None)
            if value is not None:
                fields[key] = value
        tail = "".join(f" {key}={json.dumps(value, default=str)}" for key, value in fields.items())
        text = f"{_timestamp(record)} {_level_name(record):<7} {record.name}: {_message(record)}"
        text += tail
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return text


# --- setup ----------------------------------------------------------------------------------


class VoxHandler(logging.StreamHandler[TextIO]):
    """The root handler configure_logging installs (and replaces when called again)."""


def configure_logging(
    level: str = "info",
    json_format: bool = True,
    module_levels: dict[str, str] | None = None,
    *,
    stream: TextIO | None = None,
) -> None:
    """Send every log line (ours, uvicorn's, libraries') to one stderr handler.

    Idempotent: calling it again replaces the handler it installed before, so it can run
    again after uvicorn has applied its own logging config. `module_levels` sets single
    loggers' levels, e.g. ``{"uvicorn.access": "warning"}``.
    """
    root_level = parse_level(level)
    levels = {name: parse_level(value) for name, value in (module_levels or {}).items()}
    logging.addLevelName(TRACE_LEVEL, "TRACE")

    handler = VoxHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json_format else TextFormatter())
    handler.addFilter(ContextFilter())

    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, VoxHandler):
            root.removeHandler(old)
            old.close()
    root.addHandler(handler)
    root.setLevel(root_level)

    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        if not logger.handlers and not logger.propagate:
            continue  # uvicorn switched this one off (access_log=False): keep it off
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)  # one level for everything; module_levels refine it
    logging.captureWarnings(True)
    for name, value in levels.items():
        logging.getLogger(name).setLevel(value)
