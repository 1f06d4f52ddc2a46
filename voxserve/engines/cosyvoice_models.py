"""CosyVoice's official models by name, fetched into the model cache for the in-process engine.

The names are the Hugging Face ids the CosyVoice repository's README downloads
(`huggingface_hub.snapshot_download('FunAudioLLM/CosyVoice2-0.5B', ...)`); `source =
"modelscope"` fetches the same model from ModelScope under the id the README gives there
(`iic/CosyVoice2-0.5B`, `FunAudioLLM/Fun-CosyVoice3-0.5B-2512`), with ModelScope's own client,
which voxserve does not install (CosyVoice itself requires it). Hugging Face goes through
engines/hub.py: its cache (HF_HOME), its offline rule, its progress in /readyz.

A snapshot is the directory CosyVoice's `AutoModel(model_dir=...)` loads: it picks the model
class by the yaml it finds there (cosyvoice.yaml, cosyvoice2.yaml, cosyvoice3.yaml), so a
snapshot without its yaml is refused here, before CosyVoice sees it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from voxserve.engines.model_catalog import ModelRef, UnknownModel

if TYPE_CHECKING:
    from voxserve.engines.hub import Progress

Source = Literal["huggingface", "modelscope"]
SOURCES: tuple[Source, ...] = ("huggingface", "modelscope")
# The weights' licence: the CosyVoice repository (code and the models it publishes) is
# Apache-2.0 (its LICENSE); the model cards on the Hub carry no other terms.
LICENCE = "Apache-2.0"
MODELSCOPE_INSTALL = "pip install modelscope"


@dataclass(frozen=True, slots=True)
class CosyVoiceModel:
    """One model of the README's download list."""

    hf_id: str  # the name: the Hugging Face repo
    modelscope_id: str
    yaml: str  # the file AutoModel recognises the model by
    sample_rate: int


MODELS: dict[str, CosyVoiceModel] = {
    model.hf_id: model
    for model in (
        CosyVoiceModel(
            "FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
            "FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
            "cosyvoice3.yaml",
            24_000,
        ),
        CosyVoiceModel(
            "FunAudioLLM/CosyVoice2-0.5B", "iic/CosyVoice2-0.5B", "cosyvoice2.yaml", 24_000
        ),
        CosyVoiceModel(
            "FunAudioLLM/CosyVoice-300M", "iic/CosyVoice-300M", "cosyvoice.yaml", 22_050
        ),
        CosyVoiceModel(
            "FunAudioLLM/CosyVoice-300M-SFT", "iic/CosyVoice-300M-SFT", "cosyvoice.yaml", 22_050
        ),
        CosyVoiceModel(
            "FunAudioLLM/CosyVoice-300M-Instruct",
            "iic/CosyVoice-300M-Instruct",
            "cosyvoice.yaml",
            22_050,
        ),
    )
}


class UnknownCosyVoiceModel(UnknownModel):
    """Not one of the official ids; the message lists them."""


def cosyvoice_model(name: str) -> CosyVoiceModel:
    model = MODELS.get(name)
    if model is None:
        raise UnknownCosyVoiceModel(
            f"unknown CosyVoice model {name!r}; valid: {', '.join(MODELS)} "
            "(or model_dir: a local CosyVoice model directory)"
        )
    return model


def cosyvoice_ref(name: str) -> ModelRef:
    """What `name` means for `voxserve models` and /v1/models: the Hugging Face repo, all of
    it (AutoModel reads files beside its yaml that differ by version: fetch them all)."""
    model = cosyvoice_model(name)
    return ModelRef(
        name=name,
        kind="tts",
        engine="cosyvoice",
        repo_id=model.hf_id,
        allow_patterns=None,
        licence=LICENCE,
        non_commercial=False,
        source="hub",
    )


def fetch_model(
    name: str,
    *,
    source: str = "huggingface",
    offline: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
) -> Path:
    """The local snapshot directory of the model `name`, fetched on first use from `source`.
    Raises UnknownCosyVoiceModel, ValueError (a bad source, ModelScope not installed, a
    snapshot without its yaml), hub.ModelMissing (offline, not cached) or hub.FetchFailed."""
    from voxserve.engines import hub

    model = cosyvoice_model(name)
    offline = hub.hub_offline(offline)
    if source == "huggingface":
        path = hub.fetch_repo(model.hf_id, name=name, offline=offline, on_progress=on_progress)
    elif source == "modelscope":
        path = _from_modelscope(model.modelscope_id, offline)
    else:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if not (path / model.yaml).is_file():
        raise ValueError(
            f"the snapshot of {name} from {source} at {path} has no {model.yaml}; "
            "it is not a CosyVoice model directory"
        )
    return path


def _from_modelscope(model_id: str, offline: bool) -> Path:
    """ModelScope's own client (its cache: MODELSCOPE_CACHE), as the README downloads it."""
    try:
        modelscope = importlib.import_module("modelscope")
    except ImportError:
        raise ValueError(
            f"source 'modelscope' needs ModelScope's client, which is not installed: "
            f"{MODELSCOPE_INSTALL}"
        ) from None
    try:
        return Path(modelscope.snapshot_download(model_id, local_files_only=offline))
    except ValueError as exc:  # offline and not in ModelScope's cache
        raise ValueError(f"ModelScope model {model_id!r} is not downloaded: {exc}") from None
