#!/usr/bin/env bash
# Regenerate the committed Python code for the gRPC protos. Needs grpcio-tools (the `dev` extra).
# 1. proto/voxserve/v1/voxserve.proto (gRPC API v1): the proto package voxserve.v1 maps to the
#    Python package voxserve.v1, so the generated imports (`from voxserve.v1 import
#    voxserve_pb2`) resolve inside this package without rewriting. --pyi_out gives mypy the
#    message types.
# 2. proto/cosyvoice/cosyvoice.proto: CosyVoice's runtime/python/grpc proto as published
#    (package `cosyvoice`, service CosyVoice), the client side of the cosyvoice engine. It is
#    generated into voxserve/engines/cosyvoice_proto (never a top-level `cosyvoice` module,
#    which would hide the real cosyvoice package), so the one import of its _grpc module is
#    rewritten to that package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m grpc_tools.protoc \
    --proto_path=proto \
    --python_out=. \
    --pyi_out=. \
    --grpc_python_out=. \
    proto/voxserve/v1/voxserve.proto
OUT=voxserve/engines/cosyvoice_proto
"$PY" -m grpc_tools.protoc \
    --proto_path=proto/cosyvoice \
    --python_out="$OUT" \
    --pyi_out="$OUT" \
    --grpc_python_out="$OUT" \
    proto/cosyvoice/cosyvoice.proto
sed -i 's/^import cosyvoice_pb2 as cosyvoice__pb2$/from voxserve.engines.cosyvoice_proto import cosyvoice_pb2 as cosyvoice__pb2/' \
    "$OUT/cosyvoice_pb2_grpc.py"
