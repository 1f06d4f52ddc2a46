"""Audio frames from the socket's parser straight into the session.

uvicorn hands every WebSocket message to the app through an asyncio queue: a dict per
message, a task wake-up per message, and reading paused and resumed around each one (two
epoll changes). For 50 audio frames a second per stream that was most of the server's cost
per frame. `AudioFastPathProtocol` is uvicorn's websockets-sansio protocol plus one branch:
a whole binary message is offered to the connection's `FastPath` inside `data_received`,
and the session takes it there, synchronously, when nothing has to wait or be reported.

Order with the other messages is kept: the fast path is open only while the connection's
receiver task waits for a message and the queue is empty, so a frame never overtakes a
text message (mark, audio.end) still in the queue or being handled. Everything the fast
path does not take (text, fragments, a frame with an error, a frame over the credit
window, a non-16 kHz stream) goes the ASGI way, handled by the same code as before. Servers
other than ours (another ASGI server, Starlette's TestClient) have no fast path: the
extension is absent and every message takes the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger(__name__)

FAST_PATH = "voxserve.audio_fast_path"  # key in scope["extensions"]

# The uvicorn methods this subclass extends; checked at import so that a uvicorn that
# changed them runs the plain protocol (slower, same behaviour) instead of breaking.
_HOOKS = ("handle_connect", "handle_bytes")


class FastPath:
    """A connection's switch between the socket and its session. The app installs `sink`
    (takes a binary message, True if it took it) and opens the path while its receiver
    waits; `direct` and `queued` count binary messages by the way they went."""

    __slots__ = ("direct", "open", "queued", "sink")

    def __init__(self) -> None:
        self.sink: Callable[[bytes], bool] | None = None
        self.open = False
        self.direct = 0
        self.queued = 0


class AudioFastPathProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol with the audio fast path (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_path: FastPath | None = None

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # the handshake went on to the app
            self.fast_path = FastPath()
            scope["extensions"][FAST_PATH] = self.fast_path

    def handle_bytes(self, event: Any) -> None:
        fast = self.fast_path
        if fast is not None and fast.sink is not None:
            if fast.open and event.fin and not self.close_sent and self.queue.empty():
                try:
                    taken = fast.sink(event.data)
                except Exception:
                    # A bug here must not cost the connection (an exception in
                    # data_received closes it): this stream goes the queued way from now on.
                    log.exception("audio fast path failed; this stream's audio takes the queue")
                    fast.sink = _refuse
                    taken = False
                if taken:
                    fast.direct += 1
                    return
            fast.queued += 1
        super().handle_bytes(event)


def _refuse(data: bytes) -> bool:
    """The sink of a connection whose fast path failed: every message takes the queue."""
    return False


def websocket_protocol() -> type[WebSocketsSansIOProtocol] | str:
    """The protocol class for uvicorn's `ws` setting."""
    if all(hasattr(WebSocketsSansIOProtocol, name) for name in _HOOKS):
        return AudioFastPathProtocol
    log.warning("this uvicorn's websockets protocol changed; audio takes the ASGI queue")
    return "websockets-sansio"


def fast_path_of(scope: Mapping[str, Any]) -> FastPath | None:
    """The connection's fast path, or None where the server has none."""
    extensions = scope.get("extensions") or {}
    fast = extensions.get(FAST_PATH)
    return fast if isinstance(fast, FastPath) else None
