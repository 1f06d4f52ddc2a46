"""One or more values of every server event, each with the dict the emit sites built before
events were typed (same keys, same order, nulls where they were null): what the WebSocket
must keep sending."""

from __future__ import annotations

from typing import Any

from voxserve import events as ev

ASSISTANT_STARTED = ev.SessionStarted(
    session_id="9f1c00aa11bb22cc",
    trace_id="call-42",
    mode="assistant",
    sample_rate=16000,
    encoding="pcm_s16le",
    language="en",
    voice="joe",
    output_sample_rate=24000,
    frame_ms=20,
    credit_window=8,
    resumable=False,
    turn_detection=ev.TurnDetectionInfo(type="semantic_vad", eagerness="auto"),
)
SAMPLES: list[tuple[ev.ServerEvent, dict[str, Any]]] = [
    (
        ASSISTANT_STARTED,
        {
            "type": "session.started",
            "session_id": "9f1c00aa11bb22cc",
            "trace_id": "call-42",
            "mode": "assistant",
            "sample_rate": 16000,
            "encoding": "pcm_s16le",
            "language": "en",
            "voice": "joe",
            "output_sample_rate": 24000,
            "frame_ms": 20,
            "credit_window": 8,
            "resumable": False,
            "turn_detection": {"type": "semantic_vad", "eagerness": "auto"},
        },
    ),
    (
        ev.SessionStarted(
            session_id="s",
            trace_id="t",
            mode="tts",
            sample_rate=16000,
            encoding="pcm_s16le",
            language="en",
            voice="joe",
            output_sample_rate=16000,
            frame_ms=20,
            credit_window=None,
            resumable=True,
        ),
        {
            "type": "session.started",
            "session_id": "s",
            "trace_id": "t",
            "mode": "tts",
            "sample_rate": 16000,
            "encoding": "pcm_s16le",
            "language": "en",
            "voice": "joe",
            "output_sample_rate": 16000,
            "frame_ms": 20,
            "credit_window": None,
            "resumable": True,
            "turn_detection": None,
        },
    ),
    (
        ev.SessionUpdated(
            turn_detection=ev.TurnDetectionInfo(type="server_vad", silence_duration_ms=300)
        ),
        {
            "type": "session.updated",
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
        },
    ),
    (
        ev.SessionResumed(session_id="s", trace_id="t", acked_seq=1200, credit_window=4),
        {
            "type": "session.resumed",
            "session_id": "s",
            "trace_id": "t",
            "acked_seq": 1200,
            "credit_window": 4,
        },
    ),
    (
        ev.SessionResumed(session_id="s", trace_id="t", acked_seq=None, credit_window=None),
        {
            "type": "session.resumed",
            "session_id": "s",
            "trace_id": "t",
            "acked_seq": None,
            "credit_window": None,
        },
    ),
    (
        ev.SessionEnded(
            session_id="s",
            trace_id="t",
            reason="completed",
            received=100,
            duplicates=2,
            accepted=98,
            processed=97,
            dropped=1,
            rejected=3,
            gaps=4,
            reordered=5,
            segments=2,
            replies=1,
            interrupted=0,
            duration_ms=2500,
        ),
        {
            "type": "session.ended",
            "session_id": "s",
            "trace_id": "t",
            "reason": "completed",
            "received": 100,
            "duplicates": 2,
            "accepted": 98,
            "processed": 97,
            "dropped": 1,
            "rejected": 3,
            "gaps": 4,
            "reordered": 5,
            "segments": 2,
            "replies": 1,
            "interrupted": 0,
            "duration_ms": 2500,
        },
    ),
    (
        ev.WakeDetected(name="okay_nabu", timestamp_ms=1430),
        {"type": "wake.detected", "name": "okay_nabu", "timestamp_ms": 1430},
    ),
    (
        ev.VadStart(segment=0, start_ms=300),
        {"type": "vad.start", "segment": 0, "start_ms": 300},
    ),
    (
        ev.VadEnd(segment=0, start_ms=300, end_ms=1300),
        {"type": "vad.end", "segment": 0, "start_ms": 300, "end_ms": 1300},
    ),
    (
        ev.TranscriptPartial(segment=1, text="good morn", start_ms=0, end_ms=640),
        {
            "type": "transcript.partial",
            "segment": 1,
            "text": "good morn",
            "start_ms": 0,
            "end_ms": 640,
        },
    ),
    (
        ev.TranscriptFinal(segment=1, text="", start_ms=0, end_ms=900, language="en"),
        {
            "type": "transcript.final",
            "segment": 1,
            "text": "",
            "start_ms": 0,
            "end_ms": 900,
            "language": "en",
        },
    ),
    (
        ev.ResponseDelta(reply=1, text='Bonjour, ça va ? 👋 "quoted"\n\\'),
        {"type": "response.delta", "reply": 1, "text": 'Bonjour, ça va ? 👋 "quoted"\n\\'},
    ),
    (
        ev.ResponseText(reply=1, text="Hello there."),
        {"type": "response.text", "reply": 1, "text": "Hello there."},
    ),
    (
        ev.TtsStart(reply=0, voice="joe", sample_rate=22050),
        {
            "type": "tts.start",
            "reply": 0,
            "voice": "joe",
            "sample_rate": 22050,
            "encoding": "pcm_s16le",
        },
    ),
    (
        ev.TtsEnd(reply=0, chunks=5, audio_ms=1800, interrupted=False, underruns=0),
        {
            "type": "tts.end",
            "reply": 0,
            "chunks": 5,
            "audio_ms": 1800,
            "interrupted": False,
            "underruns": 0,
        },
    ),
    (
        ev.TtsEnd(reply=2, chunks=2, audio_ms=400, interrupted=True, underruns=1, played_ms=350),
        {
            "type": "tts.end",
            "reply": 2,
            "chunks": 2,
            "audio_ms": 400,
            "interrupted": True,
            "underruns": 1,
            "played_ms": 350,
        },
    ),
    (
        ev.TtsFallback(reply=3, reason="slow", text="One moment."),
        {"type": "tts.fallback", "reply": 3, "reason": "slow", "text": "One moment."},
    ),
    (
        ev.BargeIn(segment=2),
        {"type": "barge_in", "segment": 2},
    ),
    (
        ev.Mark(id=7, acked_seq=1234),
        {"type": "mark", "id": 7, "acked_seq": 1234},
    ),
    (
        ev.Mark(id="m-1", acked_seq=None),  # audio mode, no frame accepted yet
        {"type": "mark", "id": "m-1", "acked_seq": None},
    ),
    (
        ev.Mark(id=-(1 << 63)),  # tts mode, or after the end of input: no acked_seq
        {"type": "mark", "id": -(1 << 63)},
    ),
    (
        ev.Credit(window=4, acked_seq=1234),
        {"type": "credit", "window": 4, "acked_seq": 1234},
    ),
    (
        ev.Credit(window=8, acked_seq=None),
        {"type": "credit", "window": 8, "acked_seq": None},
    ),
    (
        ev.ErrorEvent(code="odd_length_pcm", message="PCM16 payload has odd length 3", fatal=False),
        {
            "type": "error",
            "code": "odd_length_pcm",
            "message": "PCM16 payload has odd length 3",
            "fatal": False,
        },
    ),
    (
        ev.ErrorEvent(
            code="overloaded",
            message="m",
            fatal=True,
            stage="asr",
            retry_after_ms=2000,
            segment=4,
            reply=4,
            trace_id="t",
        ),
        {
            "type": "error",
            "code": "overloaded",
            "message": "m",
            "fatal": True,
            "stage": "asr",
            "retry_after_ms": 2000,
            "segment": 4,
            "reply": 4,
            "trace_id": "t",
        },
    ),
]
