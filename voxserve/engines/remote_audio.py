"""A remote's streamed audio body, read on a thread of its own as fast as it comes, and
taken by the TTS stage in chunks as playback needs them (engines/openai_tts.py).

Reading on the pipeline's pulls instead made each chunk's time the remote's gaps between
sentences: the stage makes each next chunk due when the audio already made would have
played out, less what the previous chunk took to come
(pipeline/synthesis/engine_chunks.py), so one gap made the next chunk "late" (flow pressure;
admission then sheds new work) although the remote was well ahead of playback. With a
reader, a chunk asked for after the wait for its due time is usually there already: it takes
no time, and holds all that came meanwhile.

Both ends are bounded (issue 35): the reader stays at most `max_ahead` bytes ahead of what
was taken (then it waits, and the remote with it), and a body past `max_total` bytes is an
error: a remote that streams without end is cut off instead of filling memory or playing
forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import httpx

from voxserve.errors import VoxError

Opener = Callable[[], AbstractContextManager[httpx.Response]]


class StreamedBody:
    """Reads `open()`'s response body into a buffer until it ends, fails, or `close()`.

    `check(response)` raises (a VoxError) for an answer that is not audio; `failed(exc)`
    turns a transport error into the VoxError the caller sees. Every read is bounded by
    the HTTP client's timeout, so the reader always ends."""

    def __init__(
        self,
        open_: Opener,
        check: Callable[[httpx.Response], None],
        failed: Callable[[httpx.HTTPError], VoxError],
        *,
        max_ahead: int,
        max_total: int,
        too_long: Callable[[], VoxError],
    ) -> None:
        self._open = open_
        self._check = check
        self._failed = failed
        self._max_ahead = max_ahead
        self._max_total = max_total
        self._too_long = too_long
        self._total = 0
        self._ready = threading.Condition()
        self._buffer = bytearray()
        self._ended = False
        self._error: BaseException | None = None
        self._closed = False
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._read, name="voxserve-remote-audio")
        self._thread.daemon = True
        self._thread.start()

    def _read(self) -> None:
        try:
            with self._open() as response:
                self._check(response)
                for data in response.iter_bytes():
                    with self._ready:
                        while len(self._buffer) >= self._max_ahead and not self._closed:
                            self._ready.wait()  # `take` or `close` wakes it
                        if self._closed:
                            return  # leaving the `with` closes the connection
                        self._total += len(data)
                        if self._total > self._max_total:
                            self._error = self._too_long()
                            return
                        self._buffer += data
                        self._ready.notify_all()
        except httpx.HTTPError as exc:
            self._fail(self._failed(exc))
        except Exception as exc:  # a VoxError from `check`, or anything unexpected
            self._fail(exc)
        finally:
            with self._ready:
                self._ended = True
                self._ready.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self._ready:
            self._error = error

    def take(self, least: Callable[[], int], most: int) -> bytes | None:
        """Up to `most` bytes (whole samples) once at least `least()` are there (or all that
        is left at the end); None at the end. Raises the reader's error once what came
        before it has been taken."""
        with self._ready:
            while not self._ended and len(self._buffer) < min(least(), self._max_ahead):
                self._ready.wait(timeout=0.05)  # least() may grow with time (the first)
            size = min(len(self._buffer), most)
            size -= size % 2
            if size == 0:
                if self._error is not None:
                    raise self._error
                return None
            data = bytes(self._buffer[:size])
            del self._buffer[:size]
            self._ready.notify_all()  # a reader held at `max_ahead` may read on
            return data

    def close(self) -> None:
        """Stop reading: the reader leaves at its next read (bounded by the timeout) and
        closes the connection, so the remote stops too."""
        with self._ready:
            self._closed = True
            self._buffer.clear()
            self._ready.notify_all()
