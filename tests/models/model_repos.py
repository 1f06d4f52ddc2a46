"""Small model repos for the stand-in of the Hub (tests/hub_standin.py), of the shapes
`voxserve models` handles: a CTranslate2 Whisper repo (its files, a model card licence) and
the Piper voices repo (voices.json in the catalogue's format, each voice's .onnx, .onnx.json
and MODEL_CARD). The weights are random bytes: pulling, listing and removing never load
them."""

from __future__ import annotations

import hashlib
import json
import os

from tests.hub_standin import HubStandin

PIPER_REPO = "rhasspy/piper-voices"


def add_whisper_repo(
    hub: HubStandin, repo_id: str, *, licence: str = "mit", model_bytes: int = 1_500_000
) -> dict[str, bytes]:
    """A CTranslate2 Whisper's files (model.bin in LFS) published as `repo_id`."""
    files = {
        "model.bin": os.urandom(model_bytes),
        "config.json": b'{"alignment_heads": [], "lang_ids": []}\n',
        "tokenizer.json": b'{"version": "1.0"}\n' * 20,
        "vocabulary.txt": b"a\nb\nc\n",
        "README.md": f"---\nlicense: {licence}\n---\n".encode(),
    }
    hub.add_repo(repo_id, dict(files), card_data={"license": licence})
    return files


def voice_paths(key: str) -> tuple[str, str, str]:
    """Where the catalogue keeps a voice: {family}/{code}/{dataset}/{quality}/..."""
    code, dataset, quality = key.split("-")
    folder = f"{code.split('_')[0]}/{code}/{dataset}/{quality}"
    return f"{folder}/{key}.onnx", f"{folder}/{key}.onnx.json", f"{folder}/MODEL_CARD"


def add_piper_voices(hub: HubStandin, voices: dict[str, str], onnx_bytes: int = 300_000) -> None:
    """The Piper voices repo with `voices` (key -> the licence its MODEL_CARD names)."""
    files: dict[str, bytes] = {}
    catalogue: dict[str, object] = {}
    for key, licence in voices.items():
        onnx, config, card = voice_paths(key)
        content = {
            onnx: os.urandom(onnx_bytes),
            config: json.dumps({"audio": {"sample_rate": 16000}, "num_speakers": 1}).encode(),
            card: f"# Model card for {key}\n\n* License: {licence}\n".encode(),
        }
        files.update(content)
        code = key.split("-")[0]
        catalogue[key] = {
            "key": key,
            "name": key.split("-")[1],
            "language": {"code": code, "family": code[:2], "name_english": code},
            "quality": key.split("-")[2],
            "num_speakers": 1,
            "speaker_id_map": {},
            "files": {
                path: {"size_bytes": len(data), "md5_digest": hashlib.md5(data).hexdigest()}
                for path, data in content.items()
            },
            "aliases": [],
        }
    files["voices.json"] = json.dumps(catalogue).encode()
    hub.add_repo(PIPER_REPO, dict(files))
