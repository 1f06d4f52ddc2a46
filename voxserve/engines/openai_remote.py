"""What the remote OpenAI-compatible engines (openai_asr.py, openai_tts.py) share: the
checked options, one pooled HTTP client, how a remote failure reaches the client, and
the engine's remote, model, info, repr and close (`OpenAIEngine`).

The engines' calls are blocking and run on the executor's threads, so the client is
httpx's synchronous one (thread-safe, one pool of `max_concurrency` connections). Every
wait is bounded by `timeout_s` (connecting, each read, a free connection), so a remote
that stalls is an error, never a hang; each call fails alone.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

import httpx

from voxserve import __version__
from voxserve.engines.registry import EngineConfigError
from voxserve.errors import ErrorCode, VoxError
from voxserve.types import EngineInfo

DEVICES = ("remote", "cpu", "cuda", "auto")
"""Accepted for the same config shape as the local engines; the remote server chooses."""
API_KEY_ENV = "OPENAI_API_KEY"
_REMOTE_CODE_CHARS = 64


class Remote:
    """One remote OpenAI-compatible server: its URL, key and connection pool."""

    def __init__(
        self,
        kind: str,
        *,
        base_url: str,
        api_key: str | None,
        timeout_s: float,
        max_concurrency: int,
        device: str,
    ) -> None:
        def bad(message: str) -> NoReturn:
            raise EngineConfigError(kind, "openai", message)

        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            bad(f"option 'base_url' must be an http:// or https:// URL, not {base_url!r}")
        if not isinstance(timeout_s, int | float) or timeout_s <= 0:
            bad(f"option 'timeout_s' must be a number of seconds > 0, not {timeout_s!r}")
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            bad(f"option 'max_concurrency' must be an integer >= 1, not {max_concurrency!r}")
        if device not in DEVICES:
            bad(f"option 'device' {device!r} is not one of: {', '.join(DEVICES)}")
        self.kind = kind
        self.base_url = base_url.rstrip("/")
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout_s = float(timeout_s)
        self.client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s),
            limits=httpx.Limits(
                max_connections=max_concurrency, max_keepalive_connections=max_concurrency
            ),
        )

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path}"

    def failed(self, exc: httpx.HTTPError) -> VoxError:
        """A transport failure as the client is told it: the remote cannot be reached,
        did not answer in time, or every connection is busy (all `engine_unavailable`)."""
        where = f"remote {self.kind} server at {self.base_url}"
        if isinstance(exc, httpx.PoolTimeout):
            message = f"{where}: all connections busy for {self.timeout_s:g} s (max_concurrency)"
        elif isinstance(exc, httpx.TimeoutException):
            message = f"{where} did not answer within {self.timeout_s:g} s"
        elif isinstance(exc, httpx.ConnectError):
            message = f"cannot connect to {where}"
        else:
            message = f"connection to {where} failed ({type(exc).__name__})"
        return VoxError(ErrorCode.ENGINE_UNAVAILABLE, message, stage=self.kind)

    def refused(self, response: httpx.Response) -> VoxError:
        """An HTTP error answer (its body already read) as the client is told it: the
        remote's status and its own error code, never its message (it may quote text)."""
        status = response.status_code
        where = f"remote {self.kind} server at {self.base_url} answered HTTP {status}"
        remote_code = _error_code(response)
        detail = f" ({remote_code})" if remote_code else ""
        if status in (401, 403):
            return VoxError(
                ErrorCode.ENGINE_ERROR,
                f"{where}{detail}: check the engine's api_key (or ${API_KEY_ENV})",
                stage=self.kind,
            )
        if status in (429, 502, 503, 504):
            retry = response.headers.get("Retry-After", "")
            return VoxError(
                ErrorCode.ENGINE_UNAVAILABLE,
                f"{where}{detail}",
                stage=self.kind,
                retry_after_s=int(retry) if retry.isdigit() else None,
            )
        return VoxError(ErrorCode.ENGINE_ERROR, f"{where}{detail}", stage=self.kind)

    def close(self) -> None:
        self.client.close()


class OpenAIEngine:
    """The part every remote OpenAI-compatible engine has alike, so each writes only its call."""

    def __init__(
        self,
        kind: str,
        base_url: str,
        api_key: str | None,
        model: str,
        timeout_s: float,
        max_concurrency: int,
        device: str,
    ) -> None:
        """`kind`: "asr" or "tts"; the rest are the engine's options of those names."""
        self.remote = Remote(
            kind,
            base_url=base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            max_concurrency=max_concurrency,
            device=device,
        )
        self.model = model
        self.info = EngineInfo(kind, "openai", "voxserve", __version__, "Apache-2.0", model)

    def __repr__(self) -> str:  # never show the API key
        return f"{type(self).__name__}(base_url={self.remote.base_url!r}, model={self.model!r})"

    def close(self) -> None:
        self.remote.close()


def _error_code(response: httpx.Response) -> str:
    """OpenAI's `{"error": {"code"|"type": ...}}`, if the body is that; else ""."""
    try:
        body: Any = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return ""
    code = error.get("code") or error.get("type")
    if isinstance(code, str) and code.isprintable() and len(code) <= _REMOTE_CODE_CHARS:
        return code
    return ""
