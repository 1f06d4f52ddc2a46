"""gRPC end to end with the real engines (the session's live_server): recognition of a
fixture recording, streamed synthesis, and the assistant round trip."""

from __future__ import annotations

import grpc
import numpy as np

from tests.conftest import LiveServer
from tests.fakes import silence
from tests.helpers import fixture_audio, fixture_texts, wer
from tests.transports.grpc_client import audio_requests, collect, of_kind, stub
from voxserve.audio.wav import read_wav, wav_header
from voxserve.pipeline.recognition.bulk import transcribe
from voxserve.v1 import voxserve_pb2 as pb


async def test_recognize_fixture_with_partials_and_final(live_server: LiveServer) -> None:
    audio = np.concatenate([silence(0.3), fixture_audio("weather.wav"), silence(0.8)])
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        requests = audio_requests(
            pb.RecognizeRequest, pb.RecognitionConfig(language="en"), audio, speedup=2.0
        )
        responses = await collect(stub(channel).Recognize(requests))
    transcripts = of_kind(responses, "transcript")
    finals = [t for t in transcripts if t.is_final]
    assert finals and all(t.language == "en" for t in finals)
    assert [f.segment for f in finals] == list(range(len(finals)))
    text = " ".join(f.text for f in finals)
    assert wer(fixture_texts()["weather.wav"], text) <= 0.2, text
    assert any(not t.is_final for t in transcripts)  # partials while speaking
    assert 200 <= finals[0].start_ms <= 700  # speech starts ~0.3 s in
    assert finals[-1].end_ms <= audio.size * 1000 // 16_000
    assert finals[0].start_ms < finals[0].end_ms
    ended = responses[-1][1]
    assert ended.received == ended.processed == -(-audio.size // 320)


async def test_synthesize_streams_audio_that_transcribes_back(live_server: LiveServer) -> None:
    # A sentence Whisper hears right every time: piper samples noise, so its audio differs
    # per call, and "The train leaves at nine." came back as "betraying leaves at 9." in
    # about 1 of 6 syntheses (measured 2026-11-29; this one 8 of 8 exact, and 12 of 12 from
    # the engines alone). Still, a CI run once heard "Please turn on the whites and the
    # kitchen." (WER 0.25: two words of eight), so two misheard words are allowed.
    text = "Please turn on the lights in the kitchen."
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        request = pb.SynthesizeRequest(text=text, voice="joe", sample_rate=16_000)
        responses = await collect(stub(channel).Synthesize(request))
    kinds = [k for k, _ in responses]
    assert kinds[0] == "started" and kinds[-1] == "ended" and kinds.count("audio") >= 2
    started, ended = responses[0][1], responses[-1][1]
    assert (started.voice, started.sample_rate, started.encoding) == ("joe", 16_000, "pcm_s16le")
    pcm = b"".join(a.pcm for a in of_kind(responses, "audio"))
    assert ended.audio_ms == len(pcm) // 2 * 1000 // 16_000 and ended.chunks == kinds.count("audio")
    samples, rate = read_wav(wav_header(16_000, len(pcm)) + pcm)
    result = await transcribe(live_server.runtime, samples, rate)
    assert wer(text, result.text) <= 0.25, result.text


async def test_converse_assistant_round_trip(live_server: LiveServer) -> None:
    question = np.concatenate([silence(0.3), fixture_audio("command.wav"), silence(1.0)])
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        config = pb.StreamConfig(mode=pb.MODE_ASSISTANT, voice="joe", output_sample_rate=16_000)
        requests = audio_requests(pb.ConverseRequest, config, question, speedup=2.0)
        responses = await collect(stub(channel).Converse(requests))
    kinds = [k for k, _ in responses]
    finals = [t for t in of_kind(responses, "transcript") if t.is_final]
    assert finals and wer(fixture_texts()["command.wav"], finals[0].text) <= 0.25
    replies = of_kind(responses, "response_text")
    assert replies and any(w in replies[0].text.lower() for w in ("it's", "it is"))
    assert replies[0].reply == finals[0].segment
    assert kinds.index("tts_start") < kinds.index("audio") < kinds.index("tts_end")
    tts_start = of_kind(responses, "tts_start")[0]
    assert tts_start.voice == "joe" and tts_start.sample_rate == 16_000
    audio = of_kind(responses, "audio")
    assert {a.reply for a in audio} == {replies[0].reply}
    assert sum(len(a.pcm) for a in audio) > 16_000  # more than half a second of speech
    assert kinds[-1] == "ended" and responses[-1][1].replies == 1


async def test_listing_names_the_real_voices_and_models(live_server: LiveServer) -> None:
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        voices = await stub(channel).ListVoices(pb.ListVoicesRequest())
        engines = await stub(channel).ListEngines(pb.ListEnginesRequest())
    assert voices.default_voice == "joe" and "joe" in {v.id for v in voices.voices}
    asr = next(e for e in engines.engines if e.kind == "asr")
    assert asr.name == "whisper" and "en" in asr.languages
