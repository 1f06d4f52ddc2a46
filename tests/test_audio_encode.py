"""audio/encode.py on its own (real PyAV): what a client gone mid-stream leaves behind."""

from __future__ import annotations

import threading

import numpy as np

from voxserve.audio.encode import AvEncoder, open_encoder


def test_close_during_an_encode_in_another_thread_does_not_wait_for_it() -> None:
    """The event loop closes an encoder whose worker thread is still encoding a chunk (the
    client left): close() returns at once, and the worker closes the codec when done."""
    encoder = open_encoder("opus", 48_000)
    assert isinstance(encoder, AvEncoder)
    tone = (np.sin(np.arange(48_000 * 60) / 7) * 8_000).astype(np.int16)  # a long chunk
    worker = threading.Thread(target=encoder.encode, args=(tone,))
    worker.start()
    while not encoder._lock.locked() and worker.is_alive():
        pass
    encoder.close()
    assert encoder._lock.locked() and worker.is_alive()  # close() did not wait
    worker.join()
    assert encoder._closed  # the worker closed it
    assert encoder.encode(tone[:960]) == b""  # nothing more is encoded
