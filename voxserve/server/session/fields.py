"""Reading the fields of a Realtime client event: each getter checks a value's JSON type and
range and raises the code docs/realtime.md gives (`invalid_message` for a missing or
ill-typed field, `invalid_parameter` for a value out of range), naming the field by its
path ("session.audio.input.turn_detection.threshold"), so a client finds what to fix.
Pure: no I/O (server/realtime_api/codec.py)."""

from __future__ import annotations

from typing import Any, TypeVar

from voxserve.errors import ErrorCode, VoxError, quoted

SILENCE_MS = (20, 10_000)  # a turn detection's silence_duration_ms (the Realtime API's range)

T = TypeVar("T")
Obj = dict[str, Any]
MAX_ID = 64  # item, call and event ids: OpenAI's are about 32 characters


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def invalid(message: str) -> VoxError:
    return VoxError(ErrorCode.INVALID_MESSAGE, message)


def bad_value(path: str, why: str) -> VoxError:
    return VoxError(ErrorCode.INVALID_PARAMETER, f"{path} {why}")


def _given(data: Obj, key: str, path: str, required: bool) -> Any:
    """The field's value; None when absent or null, unless `required` (then it raises)."""
    value = data.get(key)
    if value is None and required:
        raise invalid(f"{_at(path, key)} is required")
    return value


def _typed(
    data: Obj, key: str, path: str, kind: type[T], what: str, required: bool = False
) -> T | None:
    """The field's value, which must be a `kind` (`what`, in the error); None when absent
    or null, unless `required`."""
    value = _given(data, key, path, required)
    if value is None or isinstance(value, kind):
        return value
    raise invalid(f"{_at(path, key)} must be {what}")


def obj(data: Obj, key: str, path: str, *, required: bool = False) -> Obj | None:
    """A nested object; None when absent or null (unless required)."""
    return _typed(data, key, path, dict, "an object", required)


def string(data: Obj, key: str, path: str, *, required: bool = False, limit: int = 0) -> str | None:
    value = _typed(data, key, path, str, "a string", required)
    if value is not None and limit and len(value) > limit:
        raise bad_value(f"{_at(path, key)}", f"is longer than {limit} characters")
    return value


def an_id(data: Obj, key: str, path: str, *, required: bool = False) -> str | None:
    value = string(data, key, path, required=required, limit=MAX_ID)
    if value is not None and not value:
        raise bad_value(f"{_at(path, key)}", "is empty")
    return value


def boolean(data: Obj, key: str, path: str) -> bool | None:
    return _typed(data, key, path, bool, "true or false")


def integer(
    data: Obj, key: str, path: str, low: int, high: int, *, required: bool = False
) -> int | None:
    value = _given(data, key, path, required)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{_at(path, key)} must be an integer")
    if not low <= value <= high:
        raise bad_value(f"{_at(path, key)}", f"must be {low} to {high}")
    return value


def number(data: Obj, key: str, path: str, low: float, high: float) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"{_at(path, key)} must be a number")
    if not low <= value <= high:  # also false for a huge integer: no float() overflow
        raise bad_value(f"{_at(path, key)}", f"must be {low:g} to {high:g}")
    return float(value)


def listed(data: Obj, key: str, path: str) -> list[Any] | None:
    return _typed(data, key, path, list, "an array")


def choice(data: Obj, key: str, path: str, options: tuple[str, ...]) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if value not in options:
        raise bad_value(f"{_at(path, key)}", f"{quoted(value)} is not one of {', '.join(options)}")
    return str(value)
