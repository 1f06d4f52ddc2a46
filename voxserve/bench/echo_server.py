"""The baseline: a bare `websockets` server that speaks just enough of /v1/stream to take the
same paced load as voxserve (session.start, audio frames, marks, audio.end) and does nothing
else. Measured in the same run as voxserve, it turns voxserve's cost into a ratio that a noisy
machine affects equally on both sides.

Run: python -m voxserve.bench.echo_server --port PORT [--loop uvloop]   (loopback only)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

from websockets.asyncio.server import ServerConnection, serve


async def handle(ws: ServerConnection) -> None:
    """Answer session.start and marks at once; count and drop audio; end on audio.end."""
    frames = 0
    async for message in ws:
        if isinstance(message, bytes):
            frames += 1
            continue
        event = json.loads(message)
        kind = event.get("type")
        if kind == "session.start":
            started = {"type": "session.started", "mode": event.get("mode"), "frame_ms": 20}
            await ws.send(json.dumps(started))
        elif kind == "mark":
            await ws.send(json.dumps({"type": "mark", "id": event.get("id")}))
        elif kind in ("audio.end", "session.end"):
            ended = {"type": "session.ended", "received": frames, "processed": frames}
            await ws.send(json.dumps(ended))
            await ws.close()
            return


async def main(port: int) -> None:
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set_result, None)
    async with serve(
        handle, "127.0.0.1", port, compression=None, max_size=2**20, ping_interval=None
    ):
        print(f"echo server on ws://127.0.0.1:{port}", flush=True)
        await stop


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    options = parser.parse_args()
    if options.loop == "uvloop":
        import uvloop

        uvloop.run(main(options.port))
    else:
        asyncio.run(main(options.port))
