"""The Wyoming `info` event: the real ASR model and TTS voices of the loaded engines, so
Home Assistant's Wyoming integration lists what this server actually serves."""

from __future__ import annotations

from wyoming.info import AsrModel, AsrProgram, Attribution, Info, TtsProgram, TtsVoice

from voxserve import __version__
from voxserve.engines.loaded import Engines
from voxserve.server.wyoming.wake import wake_programs
from voxserve.types import EngineInfo

PROGRAM = "voxserve"
_VOXSERVE = Attribution(name="voxserve", url="")


def _attribution(info: EngineInfo) -> Attribution:
    """Who made a model: its package (and licence), as `voxserve engines` reports it."""
    return Attribution(name=f"{info.package} ({info.license})", url="")


def server_info(engines: Engines) -> Info:
    asr = engines.asr.info
    asr_model = AsrModel(
        name=asr.model or asr.name,
        attribution=_attribution(asr),
        installed=True,
        description=f"{asr.name} {asr.model}".strip(),
        version=asr.version,
        languages=list(engines.asr.languages),
    )
    voices = []
    for voice in engines.voices():
        _, engine = engines.voice(voice.id)
        voices.append(
            TtsVoice(
                name=voice.id,
                attribution=_attribution(engine.info),
                installed=True,
                description=voice.description or voice.id,
                version=engine.info.version,
                languages=[voice.language],
            )
        )
    return Info(
        asr=[
            AsrProgram(
                name=PROGRAM,
                attribution=_VOXSERVE,
                installed=True,
                description="voxserve speech recognition",
                version=__version__,
                models=[asr_model],
                supports_transcript_streaming=True,  # wyoming/stt.py
                requires_external_vad=True,
            )
        ],
        tts=[
            TtsProgram(
                name=PROGRAM,
                attribution=_VOXSERVE,
                installed=True,
                description="voxserve speech synthesis",
                version=__version__,
                voices=voices,
                supports_synthesize_streaming=True,
            )
        ],
        wake=wake_programs(engines.wake),
    )
