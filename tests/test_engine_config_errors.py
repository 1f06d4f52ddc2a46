"""A bad engine config stops `voxserve serve` with one line and exit 2 (issue 24, item 2):
an unknown option or engine name before the port opens, a bad option value (an
EngineConfigError raised by the constructor) once loading finds it, with one worker or
several. Before, `{"model": "nope"}` was a TypeError traceback in the log of a server that
never became ready."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.test_cli import assert_one_error_line, clean_env, run_cli
from voxserve.cluster.core_engines import build_engine as core_build_engine
from voxserve.config import EngineSpec
from voxserve.engines.loaded import build_engine
from voxserve.engines.registry import EngineConfigError, check_options, instantiate

PORTS = ("--port", "0", "--grpc-port", "0", "--wyoming-port", "0")


def serve(env: dict[str, str], *extra: str) -> Any:
    return run_cli("serve", *PORTS, "--log-level", "warning", *extra, env=clean_env(**env))


def test_an_unknown_option_stops_serve_before_it_listens() -> None:
    asr = {"name": "whisper", "options": {"no_such_option": 1}}
    proc = serve({"VOXSERVE_ENGINES__ASR": json.dumps(asr)})
    assert proc.returncode == 2
    line = assert_one_error_line(
        proc, "asr engine 'whisper'", "unknown option 'no_such_option'", "valid options:"
    )
    assert "threads" in line and "beam_size" in line  # the valid ones, named
    assert "http://" not in proc.stdout  # stopped before saying where to connect


def test_an_unknown_engine_name_stops_serve_naming_the_registered_ones() -> None:
    proc = serve({"VOXSERVE_ENGINES__TTS": json.dumps([{"name": "pipr"}])})
    assert proc.returncode == 2
    assert_one_error_line(proc, "no tts engine named 'pipr'", "registered:", "piper")
    assert "http://" not in proc.stdout


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_bad_value_found_while_loading_ends_serve_with_one_line(workers: str) -> None:
    """The openai TTS engine's constructor refuses a voice table entry (EngineConfigError)
    after the port opened: the server stops (every worker) and says it once, exit 2."""
    tts = [{"name": "openai", "options": {"voices": {"amy": {"voice": "x", "lang": "en"}}}}]
    env = {
        "VOXSERVE_ENGINES__TTS": json.dumps(tts),
        "VOXSERVE_ENGINES__ASR": json.dumps({"name": "load"}),
    }
    proc = serve(env, "--workers", workers)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("voxserve: error:")]
    assert len(errors) == 1, proc.stderr
    for needle in ("tts engine 'openai'", "'amy' has unknown key 'lang'", "valid keys: voice"):
        assert needle in errors[0], errors[0]


class Takes:
    def __init__(self, *, threads: int = 1, model: str = "a", needed: str) -> None: ...


class TakesAny:
    def __init__(self, **options: Any) -> None: ...


def test_check_options_names_the_bad_key_and_the_valid_ones() -> None:
    check_options("asr", "x", Takes, {"model": "b", "needed": "y"})
    check_options("asr", "x", TakesAny, {"anything": 1})  # **kwargs: the class judges
    with pytest.raises(EngineConfigError) as bad:
        check_options("asr", "x", Takes, {"modle": "b", "needed": "y"})
    assert str(bad.value) == (
        "asr engine 'x': unknown option 'modle'; valid options: threads, model, needed"
    )
    with pytest.raises(EngineConfigError, match="missing option 'needed'"):
        check_options("asr", "x", Takes, {})


@pytest.mark.parametrize("build", [build_engine, core_build_engine])
def test_every_place_that_builds_an_engine_checks_its_options(build: Any) -> None:
    """In process (engines/loaded.py) and in the Ray core tier's replicas alike."""
    spec = EngineSpec(name="load", options={"txet": "hi"})
    with pytest.raises(EngineConfigError, match=r"unknown option 'txet'; valid options: .*text"):
        build("asr", spec, 1)


def test_cluster_up_checks_the_core_engines_before_deploying() -> None:
    """The Ray core tier's engines (here its per-language ASR) say the same, before Ray."""
    by_language = {"es": {"name": "whisper", "options": {"modle": "base"}}}
    env = clean_env(VOXSERVE_CLUSTER__ASR_LANGUAGES=json.dumps(by_language))
    proc = run_cli("cluster", "up", env=env)
    assert proc.returncode == 2
    assert_one_error_line(proc, "asr engine 'whisper'", "unknown option 'modle'", "valid options:")


def test_a_value_of_the_wrong_type_is_named_before_construction() -> None:
    """`"model": 5` was a TypeError inside WhisperAsr: `serve` stayed up, never ready."""
    with pytest.raises(EngineConfigError) as bad:
        check_options("asr", "x", Takes, {"model": 5, "needed": "y"})
    assert str(bad.value).startswith("asr engine 'x': option 'model' = 5: input should be a valid")
    with pytest.raises(EngineConfigError, match=r"option 'threads' = 'x'.*\(int\)"):
        check_options("asr", "x", Takes, {"threads": "x", "needed": "y"})


class Refuses:
    def __init__(self, *, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError("threads must be >= 1")


def test_a_value_the_constructor_refuses_is_a_config_error() -> None:
    """A ValueError/TypeError from the constructor (`threads=0`) ends `serve` with one line
    like any EngineConfigError, rather than a traceback and a server that never gets ready."""
    with pytest.raises(EngineConfigError, match=r"asr engine 'x': bad option value: threads must"):
        instantiate("asr", "x", Refuses, {"threads": 0})


def test_serve_stops_on_a_value_whisper_refuses() -> None:
    """A type error takes the unknown option's path (check_options, before the port opens),
    tested end to end above; a refused value is found while loading, after it opens."""
    asr = {"name": "whisper", "options": {"threads": 0}}
    proc = serve({"VOXSERVE_ENGINES__ASR": json.dumps(asr)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("voxserve: error:")]
    assert len(errors) == 1 and "asr engine 'whisper'" in errors[0], proc.stderr
    assert "bad option value: threads, num_workers and beam_size must be >= 1" in errors[0]


def test_engines_shows_the_selected_options_without_loading_and_masks_keys() -> None:
    """`voxserve engines` named the selected engine but not its model or remote."""
    asr = {"name": "openai", "options": {"base_url": "http://gpu:9000/v1", "api_key": "s3cret"}}
    tts = [{"name": "espeak", "options": {"device": "cpu"}}]
    env = {"VOXSERVE_ENGINES__ASR": json.dumps(asr), "VOXSERVE_ENGINES__TTS": json.dumps(tts)}
    proc = run_cli("engines", env=clean_env(**env, VOXSERVE_ENGINES__DEFAULT_VOICE="espeak-en"))
    assert proc.returncode == 0, proc.stderr
    assert "options: base_url='http://gpu:9000/v1', api_key='***'" in proc.stdout
    assert "options: device='cpu'" in proc.stdout and "s3cret" not in proc.stdout
