"""The voxserve.v1.Voxserve servicer: the five RPCs over one shared Runtime.

Converse and Recognize are sessions (grpc_stream.SessionCall). Synthesize is the gRPC form of
POST /v1/audio/speech: validated in full before the first message, audio streamed as it is
made, not counted against the session limit (as HTTP speech is not). Listing answers from
the loaded engines, so it needs them loaded (UNAVAILABLE `not_ready` before).

Every call is one request of its key's quota (RESOURCE_EXHAUSTED `quota_exceeded` over
`requests_per_s`); the key id is found again from the metadata the auth interceptor
already checked (a hash of the token: cheap next to any RPC).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc

from voxserve.audio.pcm import Int16Array
from voxserve.engines.loaded import Engines
from voxserve.errors import VoxError
from voxserve.observe.logs import bind_session
from voxserve.pipeline.streams import aclose
from voxserve.pipeline.synthesis.request import plan
from voxserve.pipeline.synthesis.synthesize import first_audio, synthesize
from voxserve.runtime import Runtime
from voxserve.server.grpc import codec
from voxserve.server.grpc.codec import M, Undecodable
from voxserve.server.grpc.stream import (
    TRANSPORT,
    SessionCall,
    abort,
    converse_first,
    recognize_first,
    recognize_input,
)
from voxserve.server.session.admission import admit_request
from voxserve.server.session.auth import KeyRing, bearer_token, cache_scope
from voxserve.server.session.openai_models import OPENAI_ASR_MODELS, OPENAI_TTS_MODELS
from voxserve.server.session.quotas import quotas_of
from voxserve.v1 import voxserve_pb2 as pb

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


class VoxserveServicer:
    """Implements voxserve.v1.Voxserve (registered by `grpc_server.add_servicer`, which
    looks the methods up by name; requests that did not decode arrive as `Undecodable`)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.keys = KeyRing.from_settings(runtime.settings)
        self.quotas = quotas_of(runtime)

    def _principal(self, context: Context) -> str:
        """The caller's key id (the interceptor refused calls without a valid key)."""
        metadata = dict(context.invocation_metadata() or ())
        value = metadata.get("authorization")
        return self.keys.authenticate(bearer_token(value if isinstance(value, str) else None))

    async def _count_request(self, context: Context) -> None:
        """One request of the caller's quota; ends the call over the rate."""
        try:
            self.quotas.request(self._principal(context), fatal=True)
        except VoxError as exc:
            await self._fail(context, exc)

    async def Converse(  # the RPC names of the proto
        self, requests: AsyncIterator[pb.ConverseRequest | Undecodable], context: Context
    ) -> AsyncIterator[pb.ConverseResponse]:
        call = SessionCall[pb.ConverseRequest, pb.ConverseResponse](
            self.runtime,
            context,
            parse_first=converse_first,
            parse=codec.converse_input,
            response_type=pb.ConverseResponse,
            principal=self._principal(context),
        )
        async for response in call.responses(requests):
            yield response

    async def Recognize(
        self, requests: AsyncIterator[pb.RecognizeRequest | Undecodable], context: Context
    ) -> AsyncIterator[pb.RecognizeResponse]:
        call = SessionCall[pb.RecognizeRequest, pb.RecognizeResponse](
            self.runtime,
            context,
            parse_first=recognize_first,
            parse=recognize_input,
            response_type=pb.RecognizeResponse,
            principal=self._principal(context),
        )
        async for response in call.responses(requests):
            yield response

    async def Synthesize(
        self, request: pb.SynthesizeRequest | Undecodable, context: Context
    ) -> AsyncIterator[pb.SynthesizeResponse]:
        synthesis = await self._decoded(request, context)
        trace_id = uuid.uuid4().hex[:16]  # the server's, until the client's is checked
        bind_session(trace_id)  # this call's own task: its log lines carry the trace id
        try:
            given = codec.trace_id_of(synthesis.trace_id)
        except VoxError as exc:  # refused with the server's trace id, never the bad one
            await self._fail(context, exc, trace_id)
        if given is not None:
            trace_id = given
            bind_session(trace_id)
        await self._count_request(context)
        try:
            admit_request(self.runtime)  # as HTTP speech: drain, readiness, memory, load
            scope = cache_scope(self.runtime.settings, self._principal(context))
            chunks, started = self._plan(synthesis, trace_id, scope)
            first = await first_audio(chunks)
        except VoxError as exc:
            await self._fail(context, exc, trace_id)
        yield pb.SynthesizeResponse(started=started)
        count = samples = 0
        try:
            chunk: Int16Array | None = first
            while chunk is not None:
                count += 1
                samples += int(chunk.size)
                response = pb.SynthesizeResponse()
                response.audio.pcm = chunk.astype("<i2", copy=False).tobytes()
                yield response
                chunk = await anext(chunks, None)
        except VoxError as exc:
            await self._fail(context, exc, trace_id)
        finally:
            await aclose(chunks)
        audio_ms = samples * 1000 // started.sample_rate
        yield pb.SynthesizeResponse(ended=pb.SynthesisEnded(chunks=count, audio_ms=audio_ms))

    def _plan(
        self, request: pb.SynthesizeRequest, trace_id: str, scope: str
    ) -> tuple[AsyncIterator[Int16Array], pb.SynthesisStarted]:
        """Every check before the first byte, so a client mistake is a status, not a
        truncated stream."""
        runtime = self.runtime
        runtime.engines  # noqa: B018 - not_ready before the models are loaded, first
        speed = float(request.speed) if request.speed else 1.0
        # The checks `synthesize` makes at its first chunk, made here before the stream.
        checked = plan(runtime, request.text, request.voice or None, speed, request.sample_rate)
        voice, rate = checked.voice.id, checked.sample_rate
        # A one-shot request: behind live sessions' replies (pipeline/scheduling/stage.py).
        chunks = synthesize(
            runtime,
            request.text,
            voice=voice,
            speed=speed,
            sample_rate=rate,
            bulk=True,
            scope=scope,
        )
        started = pb.SynthesisStarted(
            voice=voice, sample_rate=rate, encoding="pcm_s16le", trace_id=trace_id
        )
        return chunks, started

    async def ListVoices(
        self, request: pb.ListVoicesRequest | Undecodable, context: Context
    ) -> pb.ListVoicesResponse:
        engines = await self._engines_for(request, context)
        voices = [
            pb.Voice(
                id=v.id,
                engine=v.engine,
                language=v.language,
                sample_rate=v.sample_rate,
                description=v.description,
            )
            for v in engines.voices()
        ]
        return pb.ListVoicesResponse(voices=voices, default_voice=engines.default_voice)

    async def ListEngines(
        self, request: pb.ListEnginesRequest | Undecodable, context: Context
    ) -> pb.ListEnginesResponse:
        engines = await self._engines_for(request, context)
        infos = [
            engines.vad.info,
            engines.asr.info,
            *(tts.info for tts in engines.tts),
            engines.responder.info,
        ]
        listed = [
            pb.Engine(
                kind=info.kind,
                name=info.name,
                package=info.package,
                version=info.version,
                license=info.license,
                model=info.model,
                languages=engines.asr.languages if info is engines.asr.info else (),
            )
            for info in infos
        ]
        models = dict.fromkeys(
            (
                *OPENAI_TTS_MODELS,
                *(engine.info.name for engine in engines.tts),
                *OPENAI_ASR_MODELS,
                engines.asr.info.name,
            )
        )
        return pb.ListEnginesResponse(engines=listed, models=list(models))

    async def _engines_for(self, request: M | Undecodable, context: Context) -> Engines:
        """A listing call's engines: the request decoded and counted against the caller's
        quota, or the call ended (`invalid_message`, over the rate, `not_ready`)."""
        await self._decoded(request, context)
        await self._count_request(context)
        try:
            return self.runtime.engines
        except VoxError as exc:
            await self._fail(context, exc)

    async def _decoded(self, request: M | Undecodable, context: Context) -> M:
        """A unary request, or the call ended with INVALID_ARGUMENT `invalid_message`."""
        try:
            return codec.decoded(request)
        except VoxError as exc:
            await self._fail(context, exc)

    async def _fail(
        self, context: Context, error: VoxError, trace_id: str | None = None
    ) -> NoReturn:
        self.runtime.metrics.errors.labels(error.code.value, TRANSPORT).inc()
        log.info("grpc call failed", extra={"error": error.code.value, "transport": TRANSPORT})
        await abort(context, error, trace_id)
