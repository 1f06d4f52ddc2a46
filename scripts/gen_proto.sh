#!/usr/bin/env bash
# Regenerate the committed Python code for proto/voxserve/v1/voxserve.proto (gRPC API v1).
# Needs grpcio-tools (the `dev` extra). The proto package voxserve.v1 maps to the Python
# package voxserve.v1, so the generated imports (`from voxserve.v1 import voxserve_pb2`)
# resolve inside this package without rewriting. --pyi_out gives mypy the message types.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m grpc_tools.protoc \
    --proto_path=proto \
    --python_out=. \
    --pyi_out=. \
    --grpc_python_out=. \
    proto/voxserve/v1/voxserve.proto
