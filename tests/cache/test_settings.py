"""Where the cache lives: `serve --cache-dir`, $XDG_CACHE_HOME, ~/.cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxserve.cli import bench
from voxserve.cli.cache import with_cache_dir
from voxserve.cli.parser import build_parser
from voxserve.config import default_cache_dir, load_settings


def test_serve_cache_dir_flag_chooses_the_directory(tmp_path: Path) -> None:
    args = build_parser(bench.add_placeholder).parse_args(
        ["serve", "--cache-dir", str(tmp_path / "tts")]
    )
    settings = with_cache_dir(load_settings(), args.cache_dir)
    assert settings.cache.path() == tmp_path / "tts" / "tts-cache.sqlite3"
    assert with_cache_dir(settings, None) is settings


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "voxserve"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "voxserve"


def test_cache_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXSERVE_CACHE__MAX_BYTES", "1000")
    monkeypatch.setenv("VOXSERVE_ADMIN_KEY", "s3cret")
    monkeypatch.setenv("VOXSERVE_TTS__DEGRADE__FIRST_AUDIO_BUDGET_MS", "200")
    settings = load_settings()
    assert settings.cache.max_bytes == 1000
    assert settings.admin_key is not None and settings.admin_key.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)  # a secret is never logged with the settings
    assert settings.tts.degrade.first_audio_budget_ms == 200
