"""A streaming HTTP response that closes what it streams from when it ends, however it ends.

On a client disconnect Starlette may abandon the body iterator suspended at a `yield`; it
is then closed only when garbage collected, and until then the work behind it (a synthesis,
the windows of a transcription) goes on for nobody. Closing it here, and the sources the
body reads (which an iterator that never started cannot close itself), stops that work
between two pieces: /v1/audio/speech and streamed /v1/audio/transcriptions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from voxserve.pipeline.streams import aclose


class ClosingStream(StreamingResponse):
    """`content` streamed; it and every stream in `sources` closed when the response ends."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        media_type: str,
        headers: dict[str, str],
        sources: Iterable[object] = (),
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._closing = (content, *sources)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for stream in self._closing:
                await aclose(stream)
