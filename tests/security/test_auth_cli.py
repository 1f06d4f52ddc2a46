"""The fixed interface: `voxserve serve --api-key KEY` (repeatable), `--api-keys-file`,
`--admin-key`, `--insecure-no-auth`, `--cors-origin`, and the refusal to serve without keys
on a non-loopback host."""

from __future__ import annotations

import subprocess
import sys

import pytest

from voxserve.cli.bench import add_bench
from voxserve.cli.parser import build_parser
from voxserve.cli.serve import with_auth_flags
from voxserve.config import Settings


def test_flags_reach_the_settings() -> None:
    args = build_parser(add_bench).parse_args(
        [
            "serve",
            "--api-key",
            "a",
            "--api-key",
            "sha256:" + "1" * 64,
            "--admin-key",
            "adm",
            "--insecure-no-auth",
            "--cors-origin",
            "https://app.example",
        ]
    )
    settings = with_auth_flags(Settings(), args)
    assert [k.get_secret_value() for k in settings.api_keys] == ["a", "sha256:" + "1" * 64]
    assert settings.admin_key is not None and settings.admin_key.get_secret_value() == "adm"
    assert settings.insecure_no_auth
    assert settings.cors_allowed_origins == ["https://app.example"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--host", "0.0.0.0", "--wyoming-port", "0"], "--insecure-no-auth"),
        (["--host", "0.0.0.0", "--api-key", "k"], "Wyoming"),
    ],
)
def test_serve_refuses_unsafe_exposure(flags: list[str], message: str) -> None:
    command = [sys.executable, "-m", "voxserve", "serve", "--port", "0", "--grpc-port", "0"]
    done = subprocess.run(command + flags, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
