"""CosyVoice in-process by name (issue 36, item 3), against the stand-in of the Hugging Face
Hub (tests/hub_standin.py).

CosyVoice cannot run here (no GPU, no `cosyvoice` package, no weights), so what is tested is
voxserve's side: an official id is fetched once into the Hugging Face cache and that snapshot
directory is what the engine hands to CosyVoice's `AutoModel(model_dir=...)`. A stand-in
`cosyvoice` package (written by the `cosyvoice_standin` fixture; a stand-in `torch` beside it
when torch is absent) has AutoModel's published behaviour (the model class chosen by the yaml
in the directory, a directory that does not exist downloaded: here refused) and reads every
file of the directory it is given, so the test compares them with the files the Hub served.
The repos hold the file names of the real models, filled with random bytes."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.hub_standin import HubStandin
from voxserve.engines import cosyvoice_local, cosyvoice_models
from voxserve.engines.cosyvoice_models import MODELS, cosyvoice_ref
from voxserve.engines.cosyvoice_tts import CosyVoiceTts
from voxserve.engines.model_catalog import UnknownModel
from voxserve.engines.registry import EngineConfigError

# The CosyVoice README's download lines (FunAudioLLM/CosyVoice, "Model download"): the
# huggingface_hub ids, and what its modelscope lines fetch for each.
README_MODELS = {
    "FunAudioLLM/Fun-CosyVoice3-0.5B-2512": "FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
    "FunAudioLLM/CosyVoice2-0.5B": "iic/CosyVoice2-0.5B",
    "FunAudioLLM/CosyVoice-300M": "iic/CosyVoice-300M",
    "FunAudioLLM/CosyVoice-300M-SFT": "iic/CosyVoice-300M-SFT",
    "FunAudioLLM/CosyVoice-300M-Instruct": "iic/CosyVoice-300M-Instruct",
}
SFT = "FunAudioLLM/CosyVoice-300M-SFT"
V2 = "FunAudioLLM/CosyVoice2-0.5B"

AUTOMODEL = """
import os
import numpy as np

LOADED = []  # every model_dir AutoModel was given


class Speech:
    def __init__(self, values):
        self.values = values

    def float(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.values


class CosyVoice:
    sample_rate = 22050

    def __init__(self, model_dir):
        self.files = {}
        for root, _, names in os.walk(model_dir):
            for name in names:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    self.files[os.path.relpath(path, model_dir)] = f.read()

    def list_available_spks(self):
        return ["中文女", "英文男"]

    def inference_sft(self, tts_text, spk_id, stream=False, speed=1.0):
        tone = 0.3 * np.sin(np.arange(2205) * 2 * np.pi * 440 / self.sample_rate)
        yield {"tts_speech": Speech(tone.reshape(1, -1))}


class CosyVoice2(CosyVoice):
    sample_rate = 24000

    def list_available_spks(self):
        return []


def AutoModel(**kwargs):
    model_dir = kwargs["model_dir"]
    if not os.path.exists(model_dir):  # CosyVoice would download it from ModelScope
        raise RuntimeError("stand-in: model_dir does not exist: " + model_dir)
    LOADED.append(model_dir)
    if os.path.exists(os.path.join(model_dir, "cosyvoice.yaml")):
        return CosyVoice(model_dir)
    if os.path.exists(os.path.join(model_dir, "cosyvoice2.yaml")):
        return CosyVoice2(model_dir)
    raise TypeError("No valid model type found!")
"""
TORCH = """
class cuda:
    @staticmethod
    def is_available():
        return False
"""


def sft_files() -> dict[str, bytes]:
    """The files of FunAudioLLM/CosyVoice-300M-SFT that CosyVoice loads (random weights)."""
    return {
        "cosyvoice.yaml": b"# stand-in\nsample_rate: 22050\n",
        "llm.pt": os.urandom(400_000),
        "flow.pt": os.urandom(300_000),
        "hift.pt": os.urandom(200_000),
        "campplus.onnx": os.urandom(100_000),
        "speech_tokenizer_v1.onnx": os.urandom(150_000),
        "spk2info.pt": os.urandom(20_000),
        "configuration.json": b'{"framework": "Pytorch", "task": "text-to-speech"}\n',
        "README.md": b"---\nlicense: apache-2.0\n---\n# CosyVoice-300M-SFT\n",
    }


@pytest.fixture
def cosyvoice_standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The stand-in `cosyvoice` package on sys.path; yields its cli.cosyvoice module."""
    if importlib.util.find_spec("cosyvoice") is not None:
        pytest.skip("a real cosyvoice package is installed")
    root = tmp_path / "standin-site"
    (root / "cosyvoice" / "cli").mkdir(parents=True)
    (root / "cosyvoice" / "__init__.py").write_text("")
    (root / "cosyvoice" / "cli" / "__init__.py").write_text("")
    (root / "cosyvoice" / "cli" / "cosyvoice.py").write_text(AUTOMODEL, encoding="utf-8")
    if importlib.util.find_spec("torch") is None:
        (root / "torch").mkdir()
        (root / "torch" / "__init__.py").write_text(TORCH)
    monkeypatch.syspath_prepend(str(root))
    module = importlib.import_module("cosyvoice.cli.cosyvoice")
    yield module
    for name in list(sys.modules):
        if name.split(".")[0] in ("cosyvoice", "torch") and str(root) in str(
            getattr(sys.modules[name], "__file__", "") or ""
        ):
            del sys.modules[name]


def one_line(error: pytest.ExceptionInfo[EngineConfigError]) -> str:
    message = str(error.value)
    assert message.startswith("tts engine 'cosyvoice': ") and "\n" not in message
    return message


def test_the_readme_ids_are_the_names() -> None:
    """Every id of the README resolves (both sources), Apache-2.0; nothing else does."""
    assert {name: model.modelscope_id for name, model in MODELS.items()} == README_MODELS
    for name in README_MODELS:
        ref = cosyvoice_ref(name)
        assert (ref.kind, ref.engine, ref.repo_id, ref.source) == ("tts", "cosyvoice", name, "hub")
        assert ref.licence == "Apache-2.0" and not ref.non_commercial
    not_models = (
        "iic/CosyVoice2-0.5B",  # a ModelScope id: the name is the HF one, source chooses
        "CosyVoice2-0.5B",
        "FunAudioLLM/CosyVoice-ttsfrd",  # a text-normalisation resource, not a model
        "FunAudioLLM/CosyVoice3-0.5B",
        "funaudiollm/cosyvoice2-0.5b",
        "Systran/faster-whisper-small",
        "",
    )
    for name in not_models:
        with pytest.raises(UnknownModel) as error:
            cosyvoice_ref(name)
        assert "valid: FunAudioLLM/Fun-CosyVoice3-0.5B-2512, " in str(error.value)


def test_a_named_model_is_fetched_once_and_handed_to_automodel(
    hub: HubStandin, hf_env: Path, cosyvoice_standin: Any, tmp_path: Path
) -> None:
    files = sft_files()
    hub.add_repo(SFT, dict(files), card_data={"license": "apache-2.0"})
    voices = {"zh-woman": "中文女"}
    tts = CosyVoiceTts(model=SFT, voices=voices, voice_dir=str(tmp_path / "voices"))
    (model_dir,) = cosyvoice_standin.LOADED
    snapshot = Path(model_dir)
    assert snapshot.is_relative_to(hf_env) and snapshot.parent.name == "snapshots"
    assert tts.transport.model.files == files  # what AutoModel read is what the Hub served
    assert tts.sample_rate == 22_050 and tts.info.model == "in-process"
    audio = np.concatenate(list(tts.synthesize("你好。", voice="zh-woman")))
    assert audio.dtype == np.int16 and audio.size == 2205 and np.abs(audio).max() > 9000
    tts.close()
    fetched = hub.content_gets()
    assert fetched >= len(files)

    again = CosyVoiceTts(model=SFT, voices=voices, voice_dir=str(tmp_path / "voices"))
    assert cosyvoice_standin.LOADED == [model_dir, model_dir]
    assert hub.content_gets() == fetched  # the cache, no download
    again.close()


def test_offline_a_model_not_in_the_cache_names_the_pull_command(
    hub: HubStandin, hf_env: Path, cosyvoice_standin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo(V2, {"cosyvoice2.yaml": b"x: 1\n", "llm.pt": os.urandom(1000)})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EngineConfigError) as error:
        CosyVoiceTts(model=V2)
    assert f"is not downloaded; run: voxserve models pull {V2}" in one_line(error)
    assert hub.requests == [] and cosyvoice_standin.LOADED == []


def test_a_snapshot_without_its_yaml_is_refused(
    hub: HubStandin, hf_env: Path, cosyvoice_standin: Any
) -> None:
    """A repo that is not the model (no cosyvoice2.yaml): one line, AutoModel never called."""
    hub.add_repo(V2, {"llm.pt": os.urandom(1000), "README.md": b"# not it\n"})
    with pytest.raises(EngineConfigError) as error:
        CosyVoiceTts(model=V2)
    assert "has no cosyvoice2.yaml" in one_line(error)
    assert cosyvoice_standin.LOADED == []


def test_without_cosyvoice_nothing_is_downloaded(hub: HubStandin, hf_env: Path) -> None:
    if cosyvoice_local.available():
        pytest.skip("a cosyvoice package is installed")
    hub.add_repo(SFT, dict(sft_files()))
    with pytest.raises(EngineConfigError) as error:
        CosyVoiceTts(model=SFT)
    message = one_line(error)
    assert "in-process synthesis needs the cosyvoice package, which is not installed" in message
    assert hub.requests == []


def test_option_errors_come_before_any_download(
    hub: HubStandin, hf_env: Path, cosyvoice_standin: Any, tmp_path: Path
) -> None:
    hub.add_repo(SFT, dict(sft_files()))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": SFT, "url": "grpc://h:1"}, "a runtime at url loads its own"),
        ({"model": SFT, "model_dir": str(tmp_path)}, "not both"),
        ({"model": SFT, "source": "pypi"}, "source must be one of huggingface, modelscope"),
        ({"model": SFT, "source": 3}, "source must be a string, got 3"),
        ({"model": "FunAudioLLM/CosyVoice3-0.5B"}, "unknown CosyVoice model"),
        ({"model": ["x"]}, "model must be a string"),
    ]
    if importlib.util.find_spec("modelscope") is None:
        cases.append(({"model": SFT, "source": "modelscope"}, "pip install modelscope"))
    for options, expected in cases:
        with pytest.raises(EngineConfigError) as error:
            CosyVoiceTts(**options)
        assert expected in one_line(error), options
    assert hub.requests == [] and cosyvoice_standin.LOADED == []


def test_fetch_model_is_what_models_pull_uses(hub: HubStandin, hf_env: Path) -> None:
    """`voxserve models pull` (engines/model_store.py) fetches through fetch_model: no
    cosyvoice package needed to pull ahead for an image."""
    files = sft_files()
    hub.add_repo(SFT, dict(files))
    path = cosyvoice_models.fetch_model(SFT)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == files
