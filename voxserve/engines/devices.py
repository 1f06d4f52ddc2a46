"""The `device` option every engine takes: which accelerator runs it.

`cpu`, `cuda` or `auto` (CUDA when the runtime has it, else the CPU). An engine that cannot
run where asked raises EngineConfigError at start (`serve` exits 2 with one line), rather
than falling back silently: a GPU deployment that ends up on the CPU is a capacity bug.
Whisper asks CTranslate2 (engines/whisper_asr.py); ONNX engines (Piper, Silero) ask
onnxruntime for its CUDAExecutionProvider; eSpeak runs on the CPU only.
"""

from __future__ import annotations

import onnxruntime as ort

from voxserve.engines.registry import EngineConfigError

DEVICES = ("cpu", "cuda", "auto")
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def check_device(kind: str, name: str, device: str) -> str:
    if device not in DEVICES:
        raise EngineConfigError(
            kind, name, f"device {device!r} is not known; valid devices: {', '.join(DEVICES)}"
        )
    return device


def onnx_providers(kind: str, name: str, device: str) -> list[str]:
    """onnxruntime providers for `device`: CUDA first (CPU for the ops it lacks) when asked
    for and installed (the onnxruntime-gpu wheel), the CPU alone otherwise."""
    check_device(kind, name, device)
    has_cuda = CUDA_PROVIDER in ort.get_available_providers()
    if device == "cuda" and not has_cuda:
        raise EngineConfigError(
            kind,
            name,
            "device 'cuda': this onnxruntime has no CUDAExecutionProvider "
            "(install onnxruntime-gpu); use cpu or auto",
        )
    if device != "cpu" and has_cuda:
        return [CUDA_PROVIDER, CPU_PROVIDER]
    return [CPU_PROVIDER]


def cpu_only(kind: str, name: str, device: str) -> None:
    """For engines with no GPU code (eSpeak): `cpu` and `auto` only."""
    check_device(kind, name, device)
    if device == "cuda":
        raise EngineConfigError(
            kind, name, "device 'cuda': this engine runs on the CPU only; valid devices: cpu, auto"
        )
