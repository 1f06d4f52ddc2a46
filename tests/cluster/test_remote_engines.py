"""RemoteAsr / RemoteTts against the real core on a simulated two-node cluster: the engine
protocol through Ray Serve, affinity by voice and language, failover, backpressure,
deadlines and cancellation."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import numpy as np
import pytest

from tests.cluster.conftest import TwoNodes, pid_alive, wait_until, where
from tests.helpers import fixture_audio, fixture_texts, wer
from voxserve.audio.pcm import to_float32
from voxserve.cluster.connect import ASR_DEPLOYMENT, TTS_DEPLOYMENT, asr_app, tts_app
from voxserve.cluster.remote_asr import RemoteAsr
from voxserve.cluster.remote_tts import RemoteTts
from voxserve.config import ClusterConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.tts_health import TtsDegraded

LONG_TEXT = "a" * 160  # load engine: 9.6 s of tone in 48 chunks, 50 ms of CPU each


def options(config: ClusterConfig) -> dict[str, Any]:
    return {"cluster": config.model_dump(mode="json")}


def handle(config: ClusterConfig, tier: str) -> Any:
    from ray import serve

    if tier == "asr":
        return serve.get_deployment_handle(ASR_DEPLOYMENT, app_name=asr_app(config))
    return serve.get_deployment_handle(TTS_DEPLOYMENT, app_name=tts_app(config))


def test_remote_engines_serve_what_the_core_serves(two_nodes: TwoNodes) -> None:
    config = two_nodes.config()
    asr = RemoteAsr(**options(config))
    assert asr.languages == ("en",)
    assert asr.info.name == "ray" and asr.info.model == "whisper/tiny.en"
    texts = fixture_texts()
    result = asr.transcribe(to_float32(fixture_audio("command.wav")))
    assert wer(texts["command.wav"], result.text) == 0.0, result.text
    names = ["lights.wav", "weather.wav"]
    batch = asr.transcribe_many([to_float32(fixture_audio(n)) for n in names], language="en")
    assert [wer(texts[n], r.text) for n, r in zip(names, batch, strict=True)] == [0.0, 0.0]
    with pytest.raises(ValueError, match="not served"):
        asr.transcribe(to_float32(fixture_audio("command.wav")), language="de")

    espeak = RemoteTts(engine="espeak", **options(config))
    assert [v.id for v in espeak.voices()] == ["espeak-en"]
    assert espeak.sample_rate == 22_050
    audio = np.concatenate(list(espeak.synthesize("Hello there. How are you?", voice="espeak-en")))
    assert audio.dtype == np.int16 and audio.size > 22_050 // 2  # over half a second
    assert np.abs(audio).max() > 1000  # speech, not silence
    with pytest.raises(ValueError, match="unknown voice"):
        espeak.synthesize("hi", voice="joe")
    with pytest.raises(ValueError, match="no engine 'piper'"):
        RemoteTts(engine="piper", **options(config))


def test_requests_stick_to_the_replica_holding_their_voice_or_language(
    two_nodes: TwoNodes,
) -> None:
    config = two_nodes.config()
    tts, asr = handle(config, "tts"), handle(config, "asr")
    list(RemoteTts(engine="load", **options(config)).synthesize("warm up", voice="load"))
    list(RemoteTts(engine="espeak", **options(config)).synthesize("warm up", voice="espeak-en"))
    RemoteAsr(**options(config)).transcribe(to_float32(fixture_audio("command.wav")))
    for tier, model_id in ((tts, "load"), (tts, "espeak-en"), (asr, "en")):
        # Loaded model ids reach the routers asynchronously (replica -> controller ->
        # handle); then every request for the id goes to a replica that holds it.
        wait_until(lambda t=tier, m=model_id: m in where(t, m)["loaded"])
        seen = [where(tier, model_id) for _ in range(8)]
        assert all(model_id in w["loaded"] for w in seen), (model_id, seen)
    # The two replicas of each tier are on different nodes (max_replicas_per_node=1).
    nodes = {w["node"] for w in wait_until(lambda: _both_replicas(tts))}
    assert len(nodes) == 2


def _both_replicas(tts: Any) -> list[dict[str, Any]] | None:
    seen = {w["replica"]: w for w in (where(tts) for _ in range(12))}
    return list(seen.values()) if len(seen) == 2 else None


def test_a_tts_stream_continues_on_another_replica_when_its_replica_dies(
    two_nodes: TwoNodes,
) -> None:
    config = two_nodes.config()
    tts = RemoteTts(engine="load", **options(config))
    reference = list(tts.synthesize(LONG_TEXT, voice="load"))
    wait_until(lambda: "load" in where(handle(config, "tts"), "load")["loaded"])
    victim = int(where(handle(config, "tts"), "load")["pid"])

    stream = tts.synthesize(LONG_TEXT, voice="load")
    chunks = [next(stream)]
    os.kill(victim, signal.SIGKILL)
    chunks += list(stream)

    assert not pid_alive(victim) or wait_until(lambda: not pid_alive(victim), 5)
    assert tts.client.failovers == 1
    # Resumed after the chunks already received: nothing lost, nothing twice.
    assert len(chunks) == len(reference)
    assert np.array_equal(np.concatenate(chunks), np.concatenate(reference))
    # Serve replaces the dead replica (later tests expect two again).
    wait_until(lambda: _both_replicas(handle(config, "tts")), timeout_s=60, every_s=1)


def test_a_full_core_queue_refuses_with_tts_degraded_and_shrinks_the_window(
    tight: ClusterConfig,
) -> None:
    tts = RemoteTts(**options(tight))
    credits = tts.client.credits
    before = credits.snapshot()
    outcomes: list[str] = []

    def one() -> None:
        try:
            list(tts.synthesize("short", voice="load"))
            outcomes.append("ok")
        except TtsDegraded as exc:
            assert exc.code is ErrorCode.TTS_DEGRADED and exc.stage == "tts"
            outcomes.append("refused")

    threads = [threading.Thread(target=one) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # One call runs, one waits in the gateway's queue for the core; the rest are refused.
    assert outcomes.count("ok") >= 1 and outcomes.count("refused") >= 2, outcomes
    after = credits.snapshot()
    # Each refusal is the core's (its queue full) or, once those shrank the window, the
    # gateway's own (no credit came free within wait_ms): both are tts_degraded.
    by_core = after["refusals"] - before["refusals"]
    by_window = after["rejected"] - before["rejected"]
    assert by_core >= 1 and by_core + by_window == outcomes.count("refused"), (after, before)
    assert after["window"] < before["window"] and after["in_flight"] == 0


def test_a_late_chunk_is_a_stage_timeout_and_cancels_the_call(tight: ClusterConfig) -> None:
    tts = RemoteTts(**options(tight.model_copy(update={"tts_chunk_timeout_s": 0.1})))
    core = handle(tight, "tts")
    before = where(core, "load")
    misses = tts.client.credits.misses
    with pytest.raises(VoxError) as caught:
        list(tts.synthesize("short", voice="load"))  # the first chunk takes 400 ms
    assert caught.value.code is ErrorCode.STAGE_TIMEOUT and caught.value.stage == "tts"
    assert tts.client.credits.misses == misses + 1
    # The call was cancelled where it stood: a replica that had begun it stops it (counted in
    # `cancelled`); one that had not yet (its event loop busy past the 100 ms deadline, as
    # on a loaded CI machine) drops it unbegun, which no user code sees. Either way the
    # core never finishes it: a probe, which the core (one call at a time) runs only after
    # the timed-out call has left it, is the only call completed since.
    probe = RemoteTts(**options(tight))
    assert np.concatenate(list(probe.synthesize("short", voice="load"))).size > 0
    after = where(core, "load")
    assert after["completed"] == before["completed"] + 1, (before, after)
    assert after["cancelled"] - before["cancelled"] in (0, 1), (before, after)


def test_closing_a_stream_cancels_the_remote_synthesis(tight: ClusterConfig) -> None:
    tts = RemoteTts(**options(tight))
    core = handle(tight, "tts")
    before = where(core, "load")
    in_flight = tts.client.credits.in_flight
    stream = tts.synthesize(LONG_TEXT, voice="load")
    next(stream)
    # The credit is back once the core answered: a reply playing out at real-time pace
    # does not hold the tier's window.
    assert tts.client.credits.in_flight == in_flight
    stream.close()  # what the pipeline does on barge-in or a client gone
    after = wait_until(
        lambda: (w := where(core, "load"))["cancelled"] == before["cancelled"] + 1 and w
    )
    assert after["completed"] == before["completed"]  # stopped, not finished
