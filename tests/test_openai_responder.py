"""OpenAIResponder against a real local HTTP server that speaks the streaming
chat-completions protocol (HTTP/1.1, chunked transfer, server-sent events)."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import voxserve
from voxserve.engines.base import (
    ChatMessage,
    Conversant,
    ReplyRequest,
    ReplyUsage,
    Responder,
    ToolCall,
    ToolCallDelta,
)
from voxserve.engines.openai_responder import ClauseBuffer, OpenAIResponder
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import ToolSpec

USER_TEXT = "my secret user text"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    connection: int


Handler = Callable[["FakeLlm", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
"""Writes one response; returns whether the connection stays open for the next request."""


@dataclass
class FakeLlm:
    """A minimal HTTP/1.1 server: keep-alive, Content-Length request bodies, scripted replies."""

    handler: Handler | None = None
    requests: list[Request] = field(default_factory=list)
    events_sent: int = 0
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = next(self._ids)
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append(
                    Request(method, path, headers, json.loads(body or b"{}"), connection)
                )
                assert self.handler is not None
                if not await self.handler(self, reader, writer):
                    return
        finally:
            self._writers.discard(writer)
            writer.close()


def chunk(content: str | None = None, **delta: Any) -> str:
    if content is not None:
        delta["content"] = content
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
    )


def sse_head(writer: asyncio.StreamWriter, content_type: str = "text/event-stream") -> None:
    writer.write(
        f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
    )


def raw_sse(body: str, *, delay: float = 0.0, terminate: bool = True) -> Handler:
    """Send `body` split into one HTTP chunk per event block, `delay` seconds apart."""
    blocks = [block + "\n\n" for block in body.split("\n\n") if block]

    async def handler(
        server: FakeLlm, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        sse_head(writer)
        for block in blocks:
            if delay:
                await asyncio.sleep(delay)
            if reader.at_eof():  # the client hung up
                server.disconnected.set()
                return False
            data = block.encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            try:
                await writer.drain()
            except ConnectionError:
                server.disconnected.set()
                return False
            server.events_sent += 1
        if not terminate:
            return False  # cut the connection mid-body
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    return handler


def stream(pieces: list[str], *, delay: float = 0.0, done: bool = True) -> Handler:
    """A realistic stream: a role-only chunk, one chunk per piece, a finish chunk, [DONE]."""
    events = [chunk(role="assistant"), *(chunk(piece) for piece in pieces)]
    events.append(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    if done:
        events.append("[DONE]")
    return raw_sse("".join(f"data: {event}\n\n" for event in events), delay=delay)


def plain(status: int, body: bytes, content_type: str = "application/json") -> Handler:
    async def handler(
        server: FakeLlm, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        return True

    return handler


async def hang(server: FakeLlm, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    sse_head(writer)
    await writer.drain()
    for _ in range(250):
        await asyncio.sleep(0.02)
        if reader.at_eof():
            server.disconnected.set()
            break
    return False


@pytest.fixture
async def llm() -> AsyncIterator[FakeLlm]:
    server = FakeLlm()
    await server.start()
    yield server
    await server.stop()


def responder(server: FakeLlm, **options: Any) -> OpenAIResponder:
    options.setdefault("trust_env", False)  # never route loopback through a proxy in tests
    return OpenAIResponder(base_url=server.base_url, **options)


async def collect(pieces: AsyncIterator[str]) -> list[str]:
    return [piece async for piece in pieces]


PIECES = [
    "Hel",
    "lo",
    " there",
    "! How",
    " can I",
    " help you",
    " today?",
    " I can tell",
    " you the time",
    ", the date, or",
    " anything else you like",
]


async def test_streams_clauses_and_sends_the_conversation(llm: FakeLlm) -> None:
    llm.handler = stream(PIECES, delay=0.005)
    bot = responder(
        llm,
        model="tiny-model",
        api_key="sk-test",
        system_prompt="Be brief.",
        temperature=0.2,
        max_tokens=64,
    )
    history = [("hi", "Hello!"), ("what's up", "Not much.")]
    try:
        pieces = await collect(bot.respond(USER_TEXT, history))
    finally:
        await bot.aclose()

    assert pieces == [
        "Hello there! ",
        "How can I help you today? ",
        "I can tell you the time, ",
        "the date, or anything else you like",
    ]
    assert "".join(pieces) == "".join(PIECES)

    (request,) = llm.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == "Bearer sk-test"
    assert "text/event-stream" in request.headers["accept"]
    assert request.body == {
        "model": "tiny-model",
        "stream": True,
        "temperature": 0.2,
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "what's up"},
            {"role": "assistant", "content": "Not much."},
            {"role": "user", "content": USER_TEXT},
        ],
    }


async def test_history_is_trimmed_and_no_key_means_no_authorization(llm: FakeLlm) -> None:
    llm.handler = stream(["Ok."])
    history = [("one", "1"), ("two", "2"), ("three", "3")]
    bot = responder(llm, system_prompt="", max_history_turns=1, max_tokens=None)
    bare = responder(llm, max_history_turns=0)
    try:
        assert await collect(bot.respond("four", history)) == ["Ok."]
        assert await collect(bare.respond("five", history)) == ["Ok."]
    finally:
        await bot.aclose()
        await bare.aclose()
    first, second = llm.requests
    assert "authorization" not in first.headers
    assert "max_tokens" not in first.body
    assert first.body["messages"] == [
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "four"},
    ]
    assert [m["role"] for m in second.body["messages"]] == ["system", "user"]


async def test_finished_streams_leave_the_connection_reusable(llm: FakeLlm) -> None:
    llm.handler = stream(["One. ", "Two."])
    bot = responder(llm)
    try:
        for _ in range(3):
            assert await collect(bot.respond("x", [])) == ["One. ", "Two."]
    finally:
        await bot.aclose()
    assert [r.connection for r in llm.requests] == [1, 1, 1]
    assert not llm.disconnected.is_set()


async def test_sse_details(llm: FakeLlm) -> None:
    """Comments, event/id fields, multi-line data, usage-only chunks, no [DONE]."""
    split = chunk("Split over lines.").replace(', "choices"', ',\ndata: "choices"')
    llm.handler = raw_sse(
        ": keep-alive\n\n"
        "event: message\nid: 1\ndata: " + chunk("Hi") + "\n\n"
        "data: " + chunk(None) + "\n\n"  # delta without content
        "data: " + split + "\n\n"
        'data: {"choices": [], "usage": {"total_tokens": 3}}\n\n'
        "retry: 1000\n\n"
    )
    bot = responder(llm)
    try:
        assert "".join(await collect(bot.respond("x", []))) == "HiSplit over lines."
    finally:
        await bot.aclose()


GARBAGE = "data: {not json\n\n"
STREAM_ERROR = 'data: {"error": {"type": "server_error", "message": "model crashed"}}\n\n'


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (plain(500, b'{"error": {"message": "boom"}}'), "HTTP 500"),
        (plain(404, b"not found", "text/plain"), "HTTP 404"),
        (raw_sse(GARBAGE), "not JSON"),
        (raw_sse('data: ["a list"]\n\n'), "not a JSON object"),
        (raw_sse('data: {"choices": {"0": 1}}\n\n'), "malformed 'choices'"),
        (plain(200, b"<html>oops</html>", "text/html"), "malformed event stream"),
        (plain(200, b""), "no server-sent events"),
        (raw_sse(STREAM_ERROR), r"reported an error in the stream \(server_error\)"),
        (raw_sse("data: " + chunk("Cut. ") + "\n\n", terminate=False), "RemoteProtocolError"),
    ],
)
async def test_server_failures_become_engine_errors(
    llm: FakeLlm, handler: Handler, message: str
) -> None:
    llm.handler = handler
    bot = responder(llm)
    try:
        with pytest.raises(VoxError, match=message) as caught:
            await collect(bot.respond(USER_TEXT, [("earlier user text", "earlier reply")]))
    finally:
        await bot.aclose()
    assert_engine_error(caught.value)


def assert_engine_error(error: VoxError) -> None:
    assert error.code is ErrorCode.ENGINE_ERROR
    assert error.stage == "responder"
    assert not error.fatal
    assert USER_TEXT not in error.message and "earlier" not in error.message
    assert "model crashed" not in error.message  # the server's own words are not relayed


async def test_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the request: nothing listens
    bot = OpenAIResponder(base_url=f"http://127.0.0.1:{port}/v1", trust_env=False)
    with pytest.raises(VoxError, match="cannot connect") as caught:
        await collect(bot.respond(USER_TEXT, []))
    assert_engine_error(caught.value)
    await bot.aclose()


async def test_timeout(llm: FakeLlm) -> None:
    llm.handler = hang
    bot = responder(llm, timeout_s=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(VoxError, match=r"did not answer within 0\.2 s") as caught:
            await collect(bot.respond(USER_TEXT, []))
    finally:
        await bot.aclose()
    assert loop.time() - started < 2
    assert_engine_error(caught.value)
    await asyncio.wait_for(llm.disconnected.wait(), 2)  # and the request was abandoned


SLOW = [f"Sentence number {n}. " for n in range(40)]


async def test_closing_the_generator_closes_the_server_stream(llm: FakeLlm) -> None:
    llm.handler = stream(SLOW, delay=0.02)
    bot = responder(llm)
    try:
        pieces = bot.respond("x", [])
        assert await anext(pieces) == "Sentence number 0. "
        await pieces.aclose()  # barge-in
        await asyncio.wait_for(llm.disconnected.wait(), 2)
    finally:
        await bot.aclose()
    assert llm.events_sent < len(SLOW)


async def test_cancelling_the_consumer_closes_the_server_stream(llm: FakeLlm) -> None:
    llm.handler = stream(SLOW, delay=0.02)
    bot = responder(llm)
    first = asyncio.Event()
    received: list[str] = []

    async def consume() -> None:
        async for piece in bot.respond("x", []):
            received.append(piece)
            first.set()

    task = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(first.wait(), 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(llm.disconnected.wait(), 2)
    finally:
        await bot.aclose()
    assert llm.events_sent < len(SLOW)
    assert 1 <= len(received) < len(SLOW)


async def test_client_is_lazy_and_reopens_after_aclose(llm: FakeLlm) -> None:
    llm.handler = stream(["Fine."])
    bot = responder(llm)
    assert bot._client is None
    await bot.aclose()  # nothing to close yet
    assert await collect(bot.respond("x", [])) == ["Fine."]
    await bot.aclose()
    assert bot._client is None
    assert await collect(bot.respond("x", [])) == ["Fine."]
    await bot.aclose()


def test_info_options_and_repr() -> None:
    bot = OpenAIResponder(base_url="http://h:1/v1/", model="m", api_key="sk-hidden")
    assert isinstance(bot, Responder)
    assert bot.url == "http://h:1/v1/chat/completions"
    assert (bot.info.kind, bot.info.name, bot.info.model) == ("responder", "openai", "m")
    assert (bot.info.package, bot.info.version, bot.info.license) == (
        "voxserve",
        voxserve.__version__,
        "Apache-2.0",
    )
    assert "sk-hidden" not in repr(bot)
    with pytest.raises(ValueError, match="base_url"):
        OpenAIResponder(base_url="127.0.0.1:8080/v1")
    with pytest.raises(ValueError, match="timeout_s"):
        OpenAIResponder(timeout_s=0)
    with pytest.raises(TypeError):
        OpenAIResponder("http://h/v1")  # type: ignore[misc]


def test_clause_buffer() -> None:
    def regroup(pieces: list[str], **options: int) -> list[str]:
        buffer = ClauseBuffer(**options)
        out = [c for piece in pieces for c in buffer.feed(piece)]
        rest = buffer.flush()
        return [*out, rest] if rest else out

    # a sentence end needs the following whitespace (3.5 is not a boundary)
    assert regroup(["It is 3", ".5 degrees", ". Nice"]) == ["It is 3.5 degrees. ", "Nice"]
    # list markers are not sentences; newlines are boundaries
    assert regroup(["Steps:\n1. Mix", " well.\n2. Bake."]) == [
        "Steps:\n",
        "1. Mix well.\n",
        "2. Bake.",
    ]
    # short clauses wait, long ones cut at the comma
    assert regroup(["Yes, sure, of course, ", "absolutely, no doubt"], min_clause_chars=20) == [
        "Yes, sure, of course, ",
        "absolutely, no doubt",
    ]
    # run-on text is cut at a space once it is long
    words = ["word "] * 30
    chunks = regroup(words, max_chunk_chars=40)
    assert all(len(c) <= 40 for c in chunks) and "".join(chunks).strip() == "".join(words).strip()
    assert all(c.endswith(" ") for c in chunks[:-1])
    # leading whitespace is not a chunk of its own; trailing whitespace is dropped
    assert regroup(["\n\n", "Hi there. ", "  "]) == ["\n\nHi there. "]


# --- conversation sessions: the whole conversation, tools and streamed tool calls --------


def tool_call_stream(*, text: str | None = None, delay: float = 0.0) -> Handler:
    """A tool-calling stream as OpenAI and vLLM send it: a role chunk (content null), maybe
    some text, then per call a first delta with `id`, `type` and `function.name` (arguments
    ""), then argument pieces with only `index` and `function.arguments`; the finish chunk
    says `tool_calls`."""

    def call(index: int, **function: str) -> dict[str, Any]:
        return {"index": index, "function": function}

    events = [chunk(role="assistant", content=None)]
    if text is not None:
        events.append(chunk(text))
    events += [
        chunk(
            tool_calls=[
                {"id": "call_abc", "type": "function", **call(0, name="weather", arguments="")}
            ]
        ),
        chunk(tool_calls=[call(0, arguments='{"ci')]),
        chunk(tool_calls=[call(0, arguments='ty": "Oslo"}')]),
        chunk(tool_calls=[{"id": "call_def", "type": "function", **call(1, name="time")}]),
        chunk(tool_calls=[call(1, arguments="{}")]),
        json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        "[DONE]",
    ]
    return raw_sse("".join(f"data: {event}\n\n" for event in events), delay=delay)


def tool_round(call_id: str, name: str, arguments: str, output: str) -> list[dict[str, Any]]:
    """A tool call and its output as the chat completions API takes them back in `messages`:
    the assistant message that made the call (content null), then the `tool` message."""
    function = {"name": name, "arguments": arguments}
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        },
        {"role": "tool", "content": output, "tool_call_id": call_id},
    ]


WEATHER = ToolSpec("weather", "The weather in a city.", {"type": "object", "properties": {}})


async def test_converse_sends_the_conversation_and_tools_and_streams_the_calls(
    llm: FakeLlm,
) -> None:
    llm.handler = tool_call_stream(delay=0.002)
    bot = responder(llm, model="m", system_prompt="Default.", max_tokens=64)
    history = (
        ChatMessage("user", "weather?"),
        ChatMessage("assistant", tool_calls=(ToolCall("call_0", "weather", '{"city": "Rome"}'),)),
        ChatMessage("tool", '{"sky": "rain"}', call_id="call_0"),
        ChatMessage("assistant", "It rains in Rome."),
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "and in Oslo?"),
    )
    request = ReplyRequest(
        messages=history,
        instructions="You call tools.",
        tools=(WEATHER, ToolSpec("time")),
        tool_choice="weather",
        max_output_tokens=32,
    )
    try:
        pieces = await collect_any(bot.converse(request))
    finally:
        await bot.aclose()
    assert pieces == [
        ToolCallDelta(0, "call_abc", "weather", ""),
        ToolCallDelta(0, None, None, '{"ci'),
        ToolCallDelta(0, None, None, 'ty": "Oslo"}'),
        ToolCallDelta(1, "call_def", "time", ""),
        ToolCallDelta(1, None, None, "{}"),
    ]
    (sent,) = llm.requests
    assert sent.body == {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},  # the response's usage
        "temperature": 0.7,
        "max_tokens": 32,
        "messages": [
            {"role": "system", "content": "You call tools."},
            {"role": "user", "content": "weather?"},
            *tool_round("call_0", "weather", '{"city": "Rome"}', '{"sky": "rain"}'),
            {"role": "assistant", "content": "It rains in Rome."},
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "and in Oslo?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "The weather in a city.",
                    "parameters": {"type": "object", "properties": {}},
                },
            },
            {"type": "function", "function": {"name": "time"}},
        ],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
    }


async def test_converse_keeps_text_before_a_call_in_order_and_maps_the_choice(
    llm: FakeLlm,
) -> None:
    llm.handler = tool_call_stream(text="Sure, one moment")  # no clause end: flushed first
    bot = responder(llm, system_prompt="Default.")
    plain_request = ReplyRequest(messages=(ChatMessage("user", "hi"),), tool_choice="required")
    try:
        pieces = await collect_any(
            bot.converse(ReplyRequest((ChatMessage("user", "x"),), tools=(WEATHER,)))
        )
        llm.handler = stream(["Hi."])
        assert await collect_any(bot.converse(plain_request)) == ["Hi."]
    finally:
        await bot.aclose()
    assert pieces[:2] == ["Sure, one moment", ToolCallDelta(0, "call_abc", "weather", "")]
    assert len(pieces) == 6
    with_tools, without = llm.requests
    assert "tool_choice" not in with_tools.body and with_tools.body["tools"]
    assert with_tools.body["messages"][0] == {"role": "system", "content": "Default."}
    assert "tools" not in without.body and "tool_choice" not in without.body  # no tools
    for choice in ("auto", "none", "required"):
        body = bot.converse_body(ReplyRequest((), tools=(WEATHER,), tool_choice=choice))
        assert body["tool_choice"] == choice
    assert "messages" in body and body["messages"] == [{"role": "system", "content": "Default."}]


@pytest.mark.parametrize(
    "tool_calls",
    [
        '{"index": 0}',  # not a list
        '["a string"]',
        '[{"index": "0", "function": {"arguments": "{}"}}]',
        '[{"index": 0, "function": {"arguments": 5}}]',
        '[{"index": 0, "function": "weather"}]',
    ],
)
async def test_malformed_tool_calls_are_engine_errors(llm: FakeLlm, tool_calls: str) -> None:
    payload = '{"choices": [{"index": 0, "delta": {"tool_calls": ' + tool_calls + "}}]}"
    llm.handler = raw_sse(f"data: {payload}\n\n")
    bot = responder(llm)
    try:
        with pytest.raises(VoxError, match="malformed 'tool_calls'") as caught:
            await collect_any(bot.converse(ReplyRequest((ChatMessage("user", USER_TEXT),))))
    finally:
        await bot.aclose()
    assert_engine_error(caught.value)


async def test_respond_ignores_calls_and_closing_converse_closes_the_stream(
    llm: FakeLlm,
) -> None:
    llm.handler = tool_call_stream(text="Text only. ")
    bot = responder(llm)
    try:
        assert await collect(bot.respond("x", [])) == ["Text only. "]
        llm.handler = stream(SLOW, delay=0.02)
        pieces = bot.converse(ReplyRequest((ChatMessage("user", "x"),)))
        assert await anext(pieces) == "Sentence number 0. "
        await pieces.aclose()  # a cancelled response
        await asyncio.wait_for(llm.disconnected.wait(), 2)
    finally:
        await bot.aclose()
    assert llm.events_sent < len(SLOW)
    assert isinstance(bot, Conversant)


async def collect_any(
    pieces: AsyncIterator[str | ToolCallDelta | ReplyUsage],
) -> list[str | ToolCallDelta | ReplyUsage]:
    return [piece async for piece in pieces]


async def test_converse_yields_the_servers_token_counts_last(llm: FakeLlm) -> None:
    """`stream_options.include_usage`: OpenAI sends the counts in a last chunk with no
    choices (after the finish chunk); some servers put them on the finish chunk. Either
    way they come last, after the text the chunker still held; partial or null usage
    objects are taken as none."""
    usage = {
        "prompt_tokens": 120,
        "completion_tokens": 9,
        "total_tokens": 129,
        "prompt_tokens_details": {"cached_tokens": 64},
    }
    events = [
        chunk(role="assistant"),
        chunk("It is sunny"),
        json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json.dumps({"choices": [], "usage": usage}),
        "[DONE]",
    ]
    llm.handler = raw_sse("".join(f"data: {event}\n\n" for event in events))
    bot = responder(llm)
    request = ReplyRequest((ChatMessage("user", "x"),))
    try:
        assert await collect_any(bot.converse(request)) == [
            "It is sunny",
            ReplyUsage(120, 9, 64),
        ]
        for partial in ({"prompt_tokens": 3}, None, {"prompt_tokens": -1, "completion_tokens": 1}):
            finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            llm.handler = raw_sse(f"data: {json.dumps(finish | {'usage': partial})}\n\n")
            assert await collect_any(bot.converse(request)) == []
        off = responder(llm, include_usage=False)
        assert "stream_options" not in off.converse_body(request)
    finally:
        await bot.aclose()
