"""`--reply-cache`: where the bench times replies, the spawned server's TTS cache is off
unless asked, so a turn includes its reply's first synthesis (the bench's replies repeat
and would come from the cache after the first cycle)."""

from __future__ import annotations

import argparse

import pytest

from voxserve.bench.cli import add_bench_parser
from voxserve.bench.target import reply_cache_env
from voxserve.config import load_settings


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


@pytest.mark.parametrize(
    ("argv", "cache_off"),
    [
        (["stream", "--spawn", "--mode", "assistant"], True),
        (["stream", "--spawn", "--mode", "realtime"], True),
        (["realtime", "--spawn"], True),
        (["ramp", "--spawn", "--mode", "webrtc"], True),
        (["stream", "--spawn", "--mode", "assistant", "--reply-cache", "on"], False),
        (["stream", "--spawn", "--mode", "asr"], False),  # no replies to time
        (["stream", "--spawn", "--mode", "tts"], False),  # the tts mode times the cache too
    ],
)
def test_the_cache_is_off_where_replies_are_timed(argv: list[str], cache_off: bool) -> None:
    env = reply_cache_env(parsed(*argv))
    assert env == ({"VOXSERVE_CACHE__ENABLED": "false"} if cache_off else {})


def test_the_variable_turns_the_servers_cache_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the spawned server reads from that environment."""
    monkeypatch.setenv("VOXSERVE_CACHE__ENABLED", "false")
    assert load_settings().cache.enabled is False
