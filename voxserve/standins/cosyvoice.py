"""Stand-ins for CosyVoice's runtimes, built from their published protocol (not from their
code, and with no model): a gRPC server of `cosyvoice.CosyVoice/Inference`
(runtime/python/grpc/cosyvoice.proto, generated in voxserve/engines/cosyvoice_proto) and an
HTTP server of the FastAPI runtime's routes (runtime/python/fastapi/server.py: form fields
in, raw int16 PCM streamed out). Each answers with a tone in `chunks` pieces, so the wire
is tested, not the voice, and records every request's fields. Used by the tests
(tests/engines/test_cosyvoice_*.py) and by `python -m voxserve.bench.cosyvoice_relay`.

A request's behaviour is chosen by a word of its text: "normal" by default; "dies" (after
the first chunk the gRPC server stops, as a killed process does, and the HTTP handler
breaks its connection, as a crashed worker does); "stalls" (after the first chunk nothing
more until `release` is set, or 30 s); "gated" (the first chunk, then the rest once
`release` is set: a test sees audio before the stream ended); "overloaded" (refused before
any audio as each runtime refuses over its limit: gRPC RESOURCE_EXHAUSTED, which the gRPC
runtime's `maximum_concurrent_rpcs` answers, and HTTP 503; not "busy", which voxserve's
default fallback phrase says); "fails" (the model raises before any audio, as CosyVoice's
frontend does for a spk_id its model lacks: KeyError; the gRPC runtime then ends the call
UNKNOWN with the exception in its details, the FastAPI one drops the connection, its
200 already sent).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from voxserve.audio.wav import read_wav
from voxserve.engines.cosyvoice_proto import cosyvoice_pb2, cosyvoice_pb2_grpc

CHUNK_S = 0.1
MODES = ("dies", "stalls", "gated", "overloaded", "fails")
STALL_LIMIT_S = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Standin:
    """What both stand-ins share: the mode, the recorded requests, the tone."""

    def __init__(self, sample_rate: int = 24_000, chunks: int = 3) -> None:
        self.sample_rate = sample_rate
        self.chunks = chunks
        self.requests: list[dict[str, Any]] = []
        self.ended = 0  # streams that sent their last chunk
        self.release = threading.Event()
        self.port = _free_port()  # chosen now: a test names the URL before `start`

    def record(self, fields: dict[str, Any]) -> str:
        """Keep the request's fields; its behaviour (module docstring)."""
        self.requests.append(fields)
        words = str(fields.get("tts_text", "")).lower().replace(".", " ").split()
        return next((mode for mode in MODES if mode in words), "normal")

    def tone(self, index: int) -> bytes:
        n = int(self.sample_rate * CHUNK_S)
        t = (np.arange(n) + index * n) / self.sample_rate
        return (np.sin(2 * np.pi * 440.0 * t) * 0.3 * 32767).astype(np.int16).tobytes()

    def wait_release(self) -> None:
        self.release.wait(STALL_LIMIT_S)


class GrpcStandin(Standin, cosyvoice_pb2_grpc.CosyVoiceServicer):  # type: ignore[misc]
    """`cosyvoice.CosyVoice/Inference` on 127.0.0.1:`port`; `start` again after a death."""

    server: Any = None

    def start(self) -> GrpcStandin:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        register: Any = cosyvoice_pb2_grpc.add_CosyVoiceServicer_to_server  # generated
        register(self, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(None)

    def Inference(self, request: Any, context: Any) -> Iterator[Any]:  # the proto names it
        kind = request.WhichOneof("RequestPayload")
        payload = getattr(request, kind)
        fields = {"kind": kind, **{f.name: v for f, v in payload.ListFields()}}
        mode = self.record(fields)
        if mode == "overloaded":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded")
        if mode == "fails":
            raise KeyError(fields.get("spk_id", ""))
        for index in range(self.chunks):
            if index == 1 and mode == "dies":
                self.server.stop(None)  # every call cancelled, the port closed
                return
            if index == 1 and mode in ("stalls", "gated"):
                self.wait_release()
            yield cosyvoice_pb2.Response(tts_audio=self.tone(index))
        self.ended += 1


def sft_client(target: str) -> Callable[[str], Iterator[bytes]]:
    """A client of the gRPC runtime at `target` (host:port): a text's `sft` request (the
    speaker "中文女"), its audio chunks as they come. The bench times the stand-in with it
    directly, beside voxserve relaying the same requests."""
    channel = grpc.insecure_channel(target)
    stub_class: Any = cosyvoice_pb2_grpc.CosyVoiceStub  # generated
    stub: Any = stub_class(channel)

    def speak(text: str) -> Iterator[bytes]:
        request = cosyvoice_pb2.Request()
        request.sft_request.spk_id = "中文女"
        request.sft_request.tts_text = text
        for response in stub.Inference(request):
            yield bytes(response.tts_audio)

    return speak


ROUTES = {
    "/inference_sft": ("sft_request", ("tts_text", "spk_id")),
    "/inference_zero_shot": ("zero_shot_request", ("tts_text", "prompt_text")),
    "/inference_cross_lingual": ("cross_lingual_request", ("tts_text",)),
    "/inference_instruct": ("instruct_request", ("tts_text", "spk_id", "instruct_text")),
}


class HttpStandin(Standin):
    """The FastAPI runtime's four routes on 127.0.0.1:`port` (uvicorn in a thread)."""

    server: Any = None

    def start(self) -> HttpStandin:
        routes = [Route(path, self._handler(path), methods=["GET", "POST"]) for path in ROUTES]
        config = uvicorn.Config(
            Starlette(routes=routes), host="127.0.0.1", port=self.port, log_level="critical"
        )
        self.server = uvicorn.Server(config)
        threading.Thread(target=self.server.run, daemon=True).start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the HTTP stand-in did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True

    def _handler(self, path: str) -> Any:
        kind, names = ROUTES[path]

        async def handle(request: Request) -> Response:
            form = await request.form()
            fields: dict[str, Any] = {"kind": kind}
            for name in names:
                fields[name] = str(form[name])  # a missing field fails, as FastAPI's Form()
            wav = form.get("prompt_wav")
            if isinstance(wav, UploadFile):
                samples, rate = read_wav(await wav.read())
                fields["prompt_rate"] = rate
                fields["prompt_audio"] = samples.tobytes()
            mode = self.record(fields)
            if mode == "overloaded":
                return Response("overloaded", status_code=503)
            return StreamingResponse(self._body(mode))

        return handle

    async def _body(self, mode: str) -> AsyncIterator[bytes]:
        if mode == "fails":
            raise KeyError("spk_id")  # uvicorn drops the connection after the 200
        for index in range(self.chunks):
            if index == 1 and mode == "dies":
                raise RuntimeError("stand-in worker died")  # uvicorn drops the connection
            if index == 1 and mode in ("stalls", "gated"):
                await asyncio.to_thread(self.wait_release)
            yield self.tone(index)
        self.ended += 1
