"""The cosyvoice engine's HTTP client: CosyVoice's FastAPI runtime
(runtime/python/fastapi/server.py), whose /inference_sft, /inference_zero_shot,
/inference_cross_lingual and /inference_instruct take form fields and stream raw int16 PCM.

The read timeout is the per-chunk deadline (it bounds each wait for bytes: the first chunk
and every gap), so a stalled runtime fails the call within `timeout_s`. A pooled connection
to a runtime that went away is replaced on the next call: nothing to reconnect by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from voxserve.engines.chunk_deadline import ChunkLate
from voxserve.engines.cosyvoice_request import CosyBusy, CosyFailed, CosyRequest, CosyUnavailable

CONNECT_TIMEOUT_S = 5.0
BUSY_STATUSES = (429, 503)


class HttpTransport:
    speeds = False  # the routes take no speed

    def __init__(self, base_url: str, timeout_s: float, max_connections: int) -> None:
        self.where = base_url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.where,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)),
            limits=httpx.Limits(max_connections=max_connections),
        )

    def stream(self, request: CosyRequest) -> Iterator[bytes]:
        path, data, files = to_form(request)
        received = 0
        try:
            with self._client.stream("POST", path, data=data, files=files) as response:
                if response.status_code in BUSY_STATUSES:
                    raise CosyBusy(f"HTTP {response.status_code}")
                if response.status_code != 200:
                    raise CosyFailed(f"HTTP {response.status_code} before any audio")
                for chunk in response.iter_bytes():
                    if chunk:
                        received += 1
                        yield chunk
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise CosyUnavailable(type(exc).__name__) from None
            raise ChunkLate() from None
        except httpx.ConnectError as exc:
            raise CosyUnavailable(type(exc).__name__) from None
        except httpx.HTTPError as exc:  # the stream broke: the runtime died or closed it
            where = "mid-stream" if received else "before any audio"
            raise CosyFailed(f"{type(exc).__name__} {where}") from None

    def close(self) -> None:
        self._client.close()


def to_form(request: CosyRequest) -> tuple[str, dict[str, str], dict[str, Any] | None]:
    """The route, form fields and file of the published FastAPI runtime for `request`."""
    if request.kind == "sft":
        return "/inference_sft", {"tts_text": request.text, "spk_id": request.spk_id}, None
    if request.kind == "instruct":
        fields = {
            "tts_text": request.text,
            "spk_id": request.spk_id,
            "instruct_text": request.instruct_text,
        }
        return "/inference_instruct", fields, None
    assert request.prompt is not None
    prompt = request.prompt
    files = {"prompt_wav": ("prompt.wav", prompt.wav(), "audio/wav")}
    if request.kind == "zero_shot":
        fields = {"tts_text": request.text, "prompt_text": prompt.text}
        return "/inference_zero_shot", fields, files
    return "/inference_cross_lingual", {"tts_text": request.text}, files
