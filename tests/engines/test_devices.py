"""Every engine's `device`: cpu, cuda or auto; what cannot run where asked is an
EngineConfigError at start (one line, exit 2), `auto` falls back to the CPU."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from voxserve.engines.devices import CPU_PROVIDER, CUDA_PROVIDER, onnx_providers
from voxserve.engines.espeak_tts import EspeakTts
from voxserve.engines.piper_tts import PiperTts
from voxserve.engines.registry import EngineConfigError
from voxserve.engines.silero_vad import SileroVad

HAS_CUDA = CUDA_PROVIDER in ort.get_available_providers()


def test_onnx_providers() -> None:
    assert onnx_providers("tts", "piper", "cpu") == [CPU_PROVIDER]
    expected = [CUDA_PROVIDER, CPU_PROVIDER] if HAS_CUDA else [CPU_PROVIDER]
    assert onnx_providers("tts", "piper", "auto") == expected
    if HAS_CUDA:
        assert onnx_providers("tts", "piper", "cuda") == expected
    else:
        with pytest.raises(EngineConfigError, match="no CUDAExecutionProvider"):
            onnx_providers("tts", "piper", "cuda")


def test_auto_loads_and_runs_where_it_can() -> None:
    vad = SileroVad(device="auto")
    assert vad._session.get_providers()[0] == (CUDA_PROVIDER if HAS_CUDA else CPU_PROVIDER)
    piper = PiperTts(device="auto")
    assert next(iter(piper.synthesize("Hello.", voice="joe"))).size > 0


@pytest.mark.parametrize(
    ("engine", "options", "needle"),
    [
        (SileroVad, {"device": "tpu"}, "vad engine 'silero': device 'tpu' is not known"),
        (PiperTts, {"device": "gpu"}, "valid devices: cpu, cuda, auto"),
        (
            EspeakTts,
            {"device": "cuda"},
            "tts engine 'espeak': device 'cuda': this engine runs on the CPU only",
        ),
    ],
)
def test_bad_devices(engine: type, options: dict[str, str], needle: str) -> None:
    with pytest.raises(EngineConfigError) as caught:
        engine(**options)
    assert needle in str(caught.value)


def test_espeak_auto_is_the_cpu() -> None:
    assert EspeakTts(device="auto").voices()
