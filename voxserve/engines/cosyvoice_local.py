"""The cosyvoice engine in-process: CosyVoice's own model classes (`cosyvoice.cli.cosyvoice`
AutoModel: CosyVoice, CosyVoice2, CosyVoice3) when the `cosyvoice` package is importable,
streaming with `inference_*(..., stream=True)` (at speed 1.0: CosyVoice applies another
speed only to a whole sentence, so that sentence comes in one piece).

Written from CosyVoice's published API (cosyvoice/cli/cosyvoice.py: prompt recordings are
passed as a path, which its frontend loads at 16 kHz); the package is not on the package
registries with its weights and needs a GPU to be useful, so this path is not run by the
test suite (docs/cosyvoice.md). CosyVoice puts its model on CUDA whenever torch sees a GPU
(cosyvoice/cli/model.py), so `device` picks which GPU (`cuda:N`) and cannot force the CPU on
a GPU host; hide the GPUs (CUDA_VISIBLE_DEVICES="") for that.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import numpy as np

from voxserve.engines.cosyvoice_request import CosyRequest

DEVICES = ("auto", "cpu", "cuda", "cuda:N")


def available() -> bool:
    """Whether the `cosyvoice` package can be imported (without importing it: torch is slow)."""
    try:
        return importlib.util.find_spec("cosyvoice") is not None
    except (ImportError, ValueError):
        return False


class LocalTransport:
    where = "in-process"
    speeds = True

    def __init__(self, model_dir: str, device: str) -> None:
        """Raises ValueError for a device torch cannot give, ImportError without cosyvoice."""
        import torch
        from cosyvoice.cli.cosyvoice import AutoModel

        _choose_device(torch, device)
        self.model: Any = AutoModel(model_dir=model_dir)
        self.sample_rate = int(self.model.sample_rate)
        self.model_name = type(self.model).__name__

    def speakers(self) -> list[str]:
        """The model's built-in speakers (spk_id), for sft and instruct voices."""
        return [str(spk) for spk in self.model.list_available_spks()]

    def stream(self, request: CosyRequest) -> Iterator[bytes]:
        for output in self._outputs(request):
            speech = output["tts_speech"].float().cpu().numpy().reshape(-1)
            yield (np.clip(speech, -1.0, 1.0) * 32767.0).astype(np.int16).tobytes()

    def _outputs(self, request: CosyRequest) -> Iterator[dict[str, Any]]:
        model, text, speed = self.model, request.text, request.speed
        # CosyVoice applies `speed` only without streaming (cosyvoice/cli/model.py: its
        # streaming path never passes speed on, and token2wav asserts "speed change only
        # support non-stream inference mode"): another speed costs the sentence's streaming.
        stream = speed == 1.0
        outputs: Iterator[dict[str, Any]]
        if request.kind == "sft":
            outputs = model.inference_sft(text, request.spk_id, stream=stream, speed=speed)
        elif request.kind == "instruct":
            if self.model_name != "CosyVoice":
                raise ValueError(
                    f"instruct voices with a spk_id need CosyVoice-300M-Instruct; "
                    f"this model is {self.model_name}"
                )
            outputs = model.inference_instruct(
                text, request.spk_id, request.instruct_text, stream=stream, speed=speed
            )
        else:
            assert request.prompt is not None
            wav = str(request.prompt.wav_path)
            if request.kind == "zero_shot":
                outputs = model.inference_zero_shot(
                    text, request.prompt.text, wav, stream=stream, speed=speed
                )
            else:
                outputs = model.inference_cross_lingual(text, wav, stream=stream, speed=speed)
        yield from outputs

    def close(self) -> None:
        self.model = None


def _choose_device(torch: Any, device: str) -> None:
    cuda = bool(torch.cuda.is_available())
    if device == "auto":
        return
    if device == "cpu":
        if cuda:
            raise ValueError(
                "CosyVoice uses CUDA whenever torch sees a GPU; "
                'for the CPU set CUDA_VISIBLE_DEVICES=""'
            )
        return
    if device == "cuda" or device.startswith("cuda:"):
        if not cuda:
            raise ValueError(f"device {device!r}: torch sees no CUDA device")
        index = device.partition(":")[2]
        if index:
            if not index.isdigit() or int(index) >= torch.cuda.device_count():
                raise ValueError(f"device {device!r}: no such GPU")
            torch.cuda.set_device(int(index))
        return
    raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
