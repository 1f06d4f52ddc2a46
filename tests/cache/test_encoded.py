"""Encodings kept beside their PCM (cache/entry.py variants): a repeated mp3, opus, aac or
flac request through the `openai` SDK is its first answer's bytes, with no synthesis and
no encoding; the first request still streams; an invalidation drops them with their PCM;
a restart keeps them; on disk, an encoding of other PCM is never loaded. Fake TTS: these
tests are about the cache, not about speech."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.cache.helpers import key, pcm, tts_cache
from tests.cache.test_cache_server import admin, server_settings
from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeTts, fake_runtime
from voxserve.cache.store import PutVariant, SqliteStore
from voxserve.cache.tts_cache import TtsCache

COMPRESSED = ("mp3", "opus", "aac", "flac")


def sdk(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.http_url}/v1", api_key="x", max_retries=0, timeout=30)


def speak(live: LiveServer, text: str, fmt: str, **extra: Any) -> bytes:
    with sdk(live) as client:
        reply = client.audio.speech.create(
            model="tts-1", voice="alloy", input=text, response_format=fmt, **extra
        )
    return reply.content


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LiveServer, FakeTts]]:
    settings = server_settings(tmp_path)
    tts = FakeTts(chunk_delay_s=0.05)
    live = start_server(settings, fake_runtime(settings, tts=tts))
    yield live, tts
    stop_server(live)


def stats(live: LiveServer) -> dict[str, Any]:
    body: dict[str, Any] = admin(live, "GET", "/admin/cache").json()
    return body


def test_a_repeated_compressed_reply_is_its_kept_encoding(
    served: tuple[LiveServer, FakeTts],
) -> None:
    live, tts = served
    for n, fmt in enumerate(COMPRESSED, start=1):
        text = f"Kept in {fmt} beside its audio."
        first = speak(live, text, fmt)
        again = speak(live, text, fmt)
        assert again == first, fmt  # byte for byte: the kept encoding, not a new one
        assert tts.calls.count(text) == 1, fmt
        now = stats(live)
        assert (now["encoded_stored"], now["encoded_hits"]) == (n, n), (fmt, now)
    # Encodings weigh in the one bound: bytes = PCM + encodings.
    assert 0 < now["encoded_bytes"] < now["bytes"]
    # wav and pcm frame the cached PCM: nothing more is kept for them.
    speak(live, "Kept in mp3 beside its audio.", "wav")
    assert stats(live)["encoded_stored"] == len(COMPRESSED)


def test_the_first_request_still_streams_and_sse_is_served_from_the_encoding(
    served: tuple[LiveServer, FakeTts],
) -> None:
    live, tts = served
    text = "One two three four five six seven eight."  # eight chunks, 50 ms apart
    with sdk(live) as client:
        sent = time.monotonic()
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text, response_format="mp3"
        ) as response:
            arrivals: list[float] = []
            parts: list[bytes] = []
            for part in response.iter_bytes():
                arrivals.append(time.monotonic() - sent)
                parts.append(part)
    assert arrivals[0] < arrivals[-1] - 0.15, arrivals  # bytes left before the end was made
    first = b"".join(parts)

    with sdk(live) as client:
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text, response_format="mp3", stream_format="sse"
        ) as response:
            events = [json.loads(line[6:]) for line in response.iter_lines() if line]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == first
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] > 0
    assert tts.calls.count(text) == 1 and stats(live)["encoded_hits"] == 1


def test_invalidation_drops_the_encodings_with_their_pcm(
    served: tuple[LiveServer, FakeTts],
) -> None:
    live, tts = served
    text = "Dropped with its audio."
    first = speak(live, text, "opus")
    dropped = admin(live, "POST", "/admin/cache/invalidate", json={"text_prefix": "Dropped"})
    assert dropped.json() == {"invalidated": 1}
    assert stats(live)["encoded_bytes"] == 0
    assert speak(live, text, "opus")
    assert tts.calls.count(text) == 2 and stats(live)["encoded_hits"] == 0
    assert first


def test_a_restart_keeps_the_encodings(tmp_path: Path) -> None:
    settings = server_settings(tmp_path)
    live = start_server(settings, fake_runtime(settings, tts=FakeTts()))
    try:
        first = speak(live, "This mp3 outlives the server.", "mp3")
        assert live.runtime.cache is not None and live.runtime.cache.flush()
    finally:
        stop_server(live)
    settings = settings.model_copy(update={"port": free_port()})
    second_tts = FakeTts()
    live = start_server(settings, fake_runtime(settings, tts=second_tts))
    try:
        assert speak(live, "This mp3 outlives the server.", "mp3") == first
        assert second_tts.calls == [] and stats(live)["encoded_hits"] == 1
    finally:
        stop_server(live)


def disk_cache(directory: Path, **config: Any) -> TtsCache:
    return tts_cache(directory, seed=1, **config)


async def test_on_disk_an_encoding_of_other_pcm_is_never_loaded(tmp_path: Path) -> None:
    cache = disk_cache(tmp_path)
    await cache.load()
    kept, stale = key("kept"), key("stale")
    for k in (kept, stale):
        assert cache.store(k, pcm(3200, seed=len(k.text_norm)))
    assert cache.add_variant(kept.digest, "mp3/x", b"mp3 of kept", 3200)
    assert not cache.add_variant(kept.digest, "mp3/x", b"again", 3200)  # has it
    assert not cache.add_variant(stale.digest, "mp3/x", b"other length", 1600)
    assert cache.flush()
    await cache.aclose()
    store = SqliteStore(tmp_path / "tts-cache.sqlite3")
    # an encoding whose PCM is not the row's (another server replaced it), and an orphan
    store.apply([PutVariant(stale.digest, "mp3/x", b"of other pcm", 12345)])
    store.apply([PutVariant("no-such-entry", "mp3/x", b"orphan", 0)])
    damaged = (kept.digest, "opus/x", b"damaged", 1, 0)  # its checksum is not its data's
    store.db.execute("INSERT INTO variants VALUES (?, ?, ?, ?, ?)", damaged)
    store.close()

    again = disk_cache(tmp_path)
    report = await again.load()
    assert report.loaded_bytes == 2 * 3200 + len(b"mp3 of kept")
    found = again.lookup_variant(kept, "mp3/x")
    assert found is not None and found[1] == b"mp3 of kept"
    assert again.lookup_variant(stale, "mp3/x") is None
    assert again.lookup_variant(kept, "opus/x") is None
    assert again.stats().encoded_bytes == len(b"mp3 of kept")
    await again.aclose()
    store = SqliteStore(tmp_path / "tts-cache.sqlite3")
    rows = store.db.execute("SELECT key FROM variants").fetchall()
    store.close()
    assert rows == [(kept.digest,)]  # the orphan, the stale and the damaged are deleted


async def test_an_encoding_is_evicted_with_its_pcm_and_counts_in_the_bound(
    tmp_path: Path,
) -> None:
    cache = disk_cache(tmp_path, max_bytes=10_000, max_entry_bytes=10_000)
    await cache.load()
    first, second = key("first"), key("second")
    assert cache.store(first, pcm(4000))
    assert cache.add_variant(first.digest, "flac/x", b"f" * 3000, 4000)
    assert cache.lru.bytes == 7000 and cache.lru.encoded_bytes == 3000
    assert not cache.add_variant(first.digest, "mp3/x", b"m" * 3001, 4000)  # over the entry
    assert cache.store(second, pcm(4000))  # 11,000 > 10,000: the first goes, encoding too
    assert first.digest not in cache.lru and cache.lru.encoded_bytes == 0
    assert cache.lru.bytes == 4000
    assert cache.flush()
    await cache.aclose()
    store = SqliteStore(tmp_path / "tts-cache.sqlite3")
    assert store.db.execute("SELECT count(*) FROM variants").fetchone() == (0,)
    store.close()
