"""Uploads stay in memory: the multipart file part is never spooled to a temporary file
(Starlette would past 1 MB), and the byte cap still holds."""

from __future__ import annotations

import pytest
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.types import Message

from voxserve.errors import ErrorCode, VoxError
from voxserve.server.session.http_requests import read_form

BOUNDARY = "vxboundary"


def _request(payload: bytes) -> Request:
    body = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + payload
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)]

    async def receive() -> Message:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/audio/transcriptions",
        "headers": [
            (b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode()),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    return Request(scope, receive)


async def test_a_large_upload_is_held_in_memory_not_a_temp_file() -> None:
    payload = bytes(range(256)) * 12_000  # 3 MB: Starlette spools past 1 MB
    form = await read_form(_request(payload), 8 * 1024 * 1024)
    upload = form["file"]
    assert isinstance(upload, UploadFile)
    spooled = upload.file
    assert not getattr(spooled, "_rolled", True)  # SpooledTemporaryFile still in memory
    assert await upload.read() == payload
    await form.close()


async def test_the_cap_still_holds() -> None:
    with pytest.raises(VoxError) as refused:
        await read_form(_request(b"x" * 300_000), 100_000)
    assert refused.value.code is ErrorCode.MESSAGE_TOO_LARGE
