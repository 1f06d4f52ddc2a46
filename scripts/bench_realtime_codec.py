"""Cost of /v1/realtime's own work per client message: decode one `input_audio_buffer.append`
(20 ms or 40 ms of 24 kHz PCM16, as `voxserve bench realtime --piece-ms` sends it) into
frames: the append fast path (realtime_codec._Append, JSON and base64 in one msgspec pass)
against the general path every other event takes (decode_json, dispatch, field checks,
binascii). What decided the fast path: appends are 50 messages a second per stream, every
other client event a few per turn.

    .venv/bin/python -m scripts.bench_realtime_codec     (from the repository root)
"""

from __future__ import annotations

import base64
import timeit
from collections.abc import Callable

from voxserve.server.realtime_api.codec import RealtimeDecoder
from voxserve.server.realtime_api.session import Installed, initial_wire

RUNS = 50_000
PIECE = bytes(range(256)) * 4  # 1,024 bytes of "audio" (any bytes are PCM16)


def append(ms: int) -> str:
    pcm = (PIECE * 4)[: 24_000 * ms // 1000 * 2]
    audio = base64.b64encode(pcm).decode()
    return '{"type":"input_audio_buffer.append","audio":"' + audio + '"}'


def us_per_call(call: Callable[[], object]) -> float:
    return min(timeit.repeat(call, number=RUNS, repeat=5)) / RUNS * 1e6


def main() -> None:
    wire = initial_wire(Installed((), ""), model="gpt-realtime")
    decoder = RealtimeDecoder(wire, 256 * 1024)
    for ms in (20, 40):
        message = append(ms)
        fast, general = decoder.decode(message), decoder.decode_event(message)
        assert [bytes(pcm) for _, pcm in fast] == [bytes(pcm) for _, pcm in general]
        before = us_per_call(lambda m=message: decoder.decode_event(m))  # type: ignore[misc]
        after = us_per_call(lambda m=message: decoder.decode(m))  # type: ignore[misc]
        print(
            f"append {ms} ms ({len(message):5d} B) decode: general {before:5.1f} us, "
            f"fast path {after:5.1f} us ({before / after:.1f}x)"
        )


if __name__ == "__main__":
    main()
