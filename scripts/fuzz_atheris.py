"""Coverage-guided fuzzing of the wire parsers with atheris (libFuzzer), on demand.

The hypothesis tests in tests/fuzz check the same property in CI (a parser returns a value
or raises VoxError, nothing else); this harness runs for as long as asked and learns from
coverage, so it reaches deeper paths. A crash stops it and writes the input to
`crash-<sha1>`: add that input as an `@example` in tests/fuzz (docs/reliability.md).

    .venv/bin/pip install atheris            # in the dev extra (a wheel on Linux, CPython 3.11)
    .venv/bin/python scripts/fuzz_atheris.py ws_text -atheris_runs=200000
    .venv/bin/python scripts/fuzz_atheris.py all -max_total_time=60

Targets: ws_text, ws_audio, wav, wyoming, grpc, all (one input fed to every parser).
Anything after the target is passed to libFuzzer (-max_total_time, -runs, a corpus dir...).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports():
    from wyoming.event import Event

    from voxserve.audio.wav import read_wav
    from voxserve.errors import VoxError
    from voxserve.server.grpc import codec as grpc_codec
    from voxserve.server.grpc.stream import converse_first, recognize_first, recognize_input
    from voxserve.server.session.stream_protocol import parse_audio_frame, parse_text_message
    from voxserve.server.wyoming.protocol import check_event, merge_data, parse_header
    from voxserve.v1 import voxserve_pb2 as pb

MAX_MESSAGE = 256 * 1024
CAP = 64 * 1024


def ws_text(data: bytes) -> None:
    # surrogateescape: bytes that are not UTF-8 become lone surrogates, a class of its own
    message = parse_text_message(data.decode("utf-8", "surrogateescape"), MAX_MESSAGE)
    _encodable(message)


def ws_audio(data: bytes) -> None:
    if data:
        rate = (8000, 16000, 22050, 24000, 48000)[data[0] % 5]
        parse_audio_frame(data[1:], rate, 200)


def wav(data: bytes) -> None:
    read_wav(data)


def wyoming(data: bytes) -> None:
    line, _, rest = data.partition(b"\n")
    header = parse_header(line, max_data=CAP, max_payload=CAP)
    event = Event(type=header.type, data=merge_data(header, rest[: header.data_length]))
    check_event(event)
    _encodable(event.data)


def grpc(data: bytes) -> None:
    """Through the server's request decoders, which never raise: bytes that are not a
    message are refused by the parsers (invalid_message) like any other bad request."""
    for message_type, parsers in (
        (pb.ConverseRequest, (converse_first, grpc_codec.converse_input)),
        (pb.RecognizeRequest, (recognize_first, recognize_input)),
    ):
        request = grpc_codec.request_decoder(message_type)(data)
        for parse in parsers:
            try:
                parse(request)  # type: ignore[operator]
            except VoxError:
                pass


def _encodable(value: object) -> None:
    """What a parser lets through can be encoded again (no lone surrogate)."""
    json.dumps(value, default=_plain, ensure_ascii=False).encode("utf-8")


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return repr(value)  # a proto message: its strings are UTF-8 by construction


TARGETS: dict[str, Callable[[bytes], None]] = {
    "ws_text": ws_text,
    "ws_audio": ws_audio,
    "wav": wav,
    "wyoming": wyoming,
    "grpc": grpc,
}


def every(data: bytes) -> None:
    for target in TARGETS.values():
        try:
            target(data)
        except VoxError:
            pass


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in (*TARGETS, "all"):
        sys.exit(f"usage: fuzz_atheris.py {{{','.join(TARGETS)},all}} [libFuzzer args]")
    name = sys.argv.pop(1)
    target = every if name == "all" else TARGETS[name]

    def one_input(data: bytes) -> None:
        try:
            target(data)
        except VoxError:
            pass  # the property: VoxError is the only way a parser may refuse

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
