"""`OpenAIEngine` (engines/openai_remote.py): what the openai ASR and TTS engines hold
alike, without a remote (nothing here connects)."""

from __future__ import annotations

from voxserve.engines.openai_asr import OpenAIAsr
from voxserve.engines.openai_tts import OpenAITts
from voxserve.types import EngineInfo


def test_each_engine_names_itself_and_never_shows_its_key() -> None:
    asr = OpenAIAsr(base_url="http://remote.test/v1/", api_key="sk-secret", model="m1")
    tts = OpenAITts(base_url="http://remote.test/v1", api_key="sk-secret", model="m2")
    try:
        assert repr(asr) == "OpenAIAsr(base_url='http://remote.test/v1', model='m1')"
        assert repr(tts) == "OpenAITts(base_url='http://remote.test/v1', model='m2')"
        assert asr.info == EngineInfo(
            "asr", "openai", "voxserve", asr.info.version, "Apache-2.0", "m1"
        )
        assert tts.info.kind == "tts" and tts.info.model == "m2"
        assert asr.remote.kind == "asr" and tts.remote.kind == "tts"
        assert asr.remote.timeout_s == 30.0 and asr.model == "m1"
    finally:
        asr.close()
        tts.close()
    assert asr.remote.client.is_closed and tts.remote.client.is_closed
