"""The in-process cosyvoice path without CosyVoice (not installable usefully here: no
weights, no GPU): which of CosyVoice's published methods (cosyvoice/cli/cosyvoice.py) each
request kind calls, with what, and how `device` is resolved. `Recorder` has those methods'
published signatures and records the calls; it stands for the model, so what is tested is
voxserve's side of the API, not CosyVoice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from voxserve.engines import cosyvoice_local
from voxserve.engines.cosyvoice_local import LocalTransport, _choose_device
from voxserve.engines.cosyvoice_request import CosyRequest, Prompt
from voxserve.engines.cosyvoice_tts import CosyVoiceTts
from voxserve.engines.registry import EngineConfigError


class Speech:
    """What CosyVoice yields as `tts_speech`: a (1, n) float tensor in [-1, 1]."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def float(self) -> Speech:
        return self

    def cpu(self) -> Speech:
        return self

    def numpy(self) -> np.ndarray:
        return self.values


class Recorder:
    def __init__(self, name: str) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.name = name

    def _out(self, method: str, *args: Any, **kwargs: Any) -> Iterator[dict[str, Speech]]:
        self.calls.append((method, args, kwargs))
        yield {"tts_speech": Speech(np.array([[0.5, -0.5, 2.0]], dtype=np.float32))}

    def list_available_spks(self) -> list[str]:
        return ["中文女", "中文男"] if self.name == "CosyVoice" else []

    def inference_sft(
        self, tts_text: str, spk_id: str, stream: bool = False, speed: float = 1.0
    ) -> Any:
        return self._out("sft", tts_text, spk_id, stream=stream, speed=speed)

    def inference_zero_shot(
        self,
        tts_text: str,
        prompt_text: str,
        prompt_wav: str,
        stream: bool = False,
        speed: float = 1.0,
    ) -> Any:
        return self._out("zero_shot", tts_text, prompt_text, prompt_wav, stream=stream, speed=speed)

    def inference_cross_lingual(
        self, tts_text: str, prompt_wav: str, stream: bool = False, speed: float = 1.0
    ) -> Any:
        return self._out("cross_lingual", tts_text, prompt_wav, stream=stream, speed=speed)

    def inference_instruct(
        self,
        tts_text: str,
        spk_id: str,
        instruct_text: str,
        stream: bool = False,
        speed: float = 1.0,
    ) -> Any:
        return self._out("instruct", tts_text, spk_id, instruct_text, stream=stream, speed=speed)


def transport(model_name: str) -> tuple[LocalTransport, Recorder]:
    local = LocalTransport.__new__(LocalTransport)  # without importing torch and CosyVoice
    recorder = Recorder(model_name)
    local.model, local.model_name, local.sample_rate = recorder, model_name, 24_000
    return local, recorder


def test_each_kind_calls_the_published_method_streaming(tmp_path: Path) -> None:
    local, recorder = transport("CosyVoice")
    wav = tmp_path / "p.wav"
    prompt = Prompt(b"", wav, "prompt words")
    requests = [
        CosyRequest("sft", "hi", spk_id="中文女", speed=1.5),
        CosyRequest("zero_shot", "hi", prompt=prompt),
        CosyRequest("cross_lingual", "hi", prompt=Prompt(b"", wav)),
        CosyRequest("instruct", "hi", spk_id="中文男", instruct_text="calm"),
    ]
    for request in requests:
        (pcm,) = list(local.stream(request))
        assert np.frombuffer(pcm, dtype=np.int16).tolist() == [16383, -16383, 32767]
    assert recorder.calls == [
        # CosyVoice applies speed only without streaming (its token2wav asserts it)
        ("sft", ("hi", "中文女"), {"stream": False, "speed": 1.5}),
        ("zero_shot", ("hi", "prompt words", str(wav)), {"stream": True, "speed": 1.0}),
        ("cross_lingual", ("hi", str(wav)), {"stream": True, "speed": 1.0}),
        ("instruct", ("hi", "中文男", "calm"), {"stream": True, "speed": 1.0}),
    ]


def test_instruct_with_a_speaker_needs_cosyvoice_300m_instruct() -> None:
    local, _ = transport("CosyVoice2")
    with pytest.raises(ValueError, match="CosyVoice-300M-Instruct"):
        list(local.stream(CosyRequest("instruct", "hi", spk_id="a", instruct_text="b")))


def test_device_resolution() -> None:
    chosen: list[int] = []
    cuda = SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1, set_device=chosen.append
    )
    gpu_host = SimpleNamespace(cuda=cuda)
    cpu_host = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: False))
    _choose_device(gpu_host, "cuda:0")
    assert chosen == [0]
    _choose_device(gpu_host, "auto")
    _choose_device(cpu_host, "cpu")
    with pytest.raises(ValueError, match='CUDA_VISIBLE_DEVICES=""'):
        _choose_device(gpu_host, "cpu")
    with pytest.raises(ValueError, match="no such GPU"):
        _choose_device(gpu_host, "cuda:1")
    with pytest.raises(ValueError, match="sees no CUDA device"):
        _choose_device(cpu_host, "cuda")
    with pytest.raises(ValueError, match="auto, cpu, cuda, cuda:N"):
        _choose_device(gpu_host, "tpu")


@pytest.mark.parametrize(
    ("model", "voices", "refused"),
    [
        ("CosyVoice2", {"w": "中文女"}, "spk_id '中文女' is not a speaker of the model"),
        ("CosyVoice", {"w": "英文女"}, "its speakers: 中文女, 中文男"),
        ("CosyVoice2", {"w": {"spk_id": "中文女", "instruct": "calm"}}, "CosyVoice-300M-Instruct"),
        ("CosyVoice", {"w": "中文女", "c": {"spk_id": "中文男", "instruct": "calm"}}, ""),
    ],
)
def test_in_process_the_table_is_checked_against_the_model_at_start(
    model: str,
    voices: dict[str, Any],
    refused: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cosyvoice_local, "available", lambda: True)

    class Loaded(LocalTransport):
        def __init__(self, model_dir: str, device: str) -> None:  # no torch, no CosyVoice
            self.model, self.model_name, self.sample_rate = Recorder(model), model, 24_000

    monkeypatch.setattr(cosyvoice_local, "LocalTransport", Loaded)

    def make() -> CosyVoiceTts:
        return CosyVoiceTts(model_dir="/m", voices=voices, voice_dir=str(tmp_path))

    if not refused:
        assert {v.id for v in make().voices()} == set(voices)
        return
    with pytest.raises(EngineConfigError, match=refused):
        make()
