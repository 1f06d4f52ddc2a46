"""Protocol stand-ins: servers of other projects' published protocols, built from the
protocol (its .proto, its documented routes), never from their code, and with no model.
Each answers with something the wire can carry (a tone) and records what it was sent, so a
test or a benchmark exercises voxserve's client of that protocol, not the remote model.

    cosyvoice.py    CosyVoice's gRPC runtime (`cosyvoice.CosyVoice/Inference`) and its
                    FastAPI runtime's routes

Used by the tests (tests/engines/test_cosyvoice_*.py) and by the bench
(`python -m voxserve.bench.cosyvoice_relay`); they import nothing of the server, the
runtime or the pipeline (pyproject.toml's contracts)."""
