"""A stand-in for an OpenAI-compatible chat-completions server (`POST /v1/chat/completions`,
streamed as server-sent events), built from OpenAI's published streaming API: chunks of
`chat.completion.chunk` objects whose `choices[0].delta` carries `content` or `tool_calls`
(per call an `index`, on its first chunk an `id`, `type` and the function's `name`, then the
`arguments` in pieces), a `finish_reason` of `stop` or `tool_calls`; with
`stream_options.include_usage` a last chunk with no choices and `usage` {prompt_tokens,
completion_tokens, total_tokens, prompt_tokens_details.cached_tokens}; then `data: [DONE]`.

It plays the LLM behind voxserve's `openai` responder. What it answers is scripted by the
conversation it is sent, as a local LLM server might:
- the last message a tool's output: ANSWER, unless the last user message asks for a loop
  ("again"): then the same tool once more, as a model that keeps calling tools;
- a request that offers a tool it knows (`get_weather`): a call of that tool with
  WEATHER_ARGUMENTS, under a fresh id (`call_1`, `call_2`, ...), or with `reuse_ids` always
  REUSED_ID (some local servers number calls per request, so every call has that id);
- anything else: GREETING.
Its usage reports the same token counts whatever it was sent. `requests` holds every body it
was sent and `call_ids` every id it gave a call, in order.

`chat_fixtures()` makes a test module's module-scoped `chat_standin` and `tool_server` (a real
server on the real engines, its `openai` responder at the stand-in)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import LiveServer, free_port, start_server, stop_server
from voxserve.config import EngineSpec, load_settings

WEATHER_ARGUMENTS = {"city": "Paris"}
TOOLS = {"get_weather": WEATHER_ARGUMENTS}  # the tools it knows, and what it calls them with
ANSWER = "It is sunny in Paris."
GREETING = "Hello there, how can I help?"
REUSED_ID = "call_0"
PROMPT_TOKENS = 123
CACHED_TOKENS = 64
COMPLETION_TOKENS = 9


class ChatStandin:
    """The stand-in in a thread, from `start()` (or `with`) to `stop()`."""

    def __init__(self, *, reuse_ids: bool = False) -> None:
        self.reuse_ids = reuse_ids
        self.requests: list[dict[str, Any]] = []
        self.call_ids: list[str] = []
        self._lock = threading.Lock()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                with standin._lock:
                    standin.requests.append(body)
                    chunks = standin.chunks(body)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def start(self) -> ChatStandin:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ChatStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages", [])
        users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
        answered = bool(messages) and messages[-1].get("role") == "tool"
        known = [t["function"]["name"] for t in body.get("tools", [])]
        known = [name for name in known if name in TOOLS]
        if answered and not (users and "again" in users[-1]):
            out = _said(ANSWER)
        elif known:
            out = self._call(known[0])
        else:
            out = _said(GREETING)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
                "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
            }
            out.append({**_chunk(None), "choices": [], "usage": usage})
        return out

    def _call(self, name: str) -> list[dict[str, Any]]:
        call_id = REUSED_ID if self.reuse_ids else f"call_{len(self.call_ids) + 1}"
        self.call_ids.append(call_id)
        arguments = json.dumps(TOOLS[name])
        half = len(arguments) // 2
        call = {"index": 0, "id": call_id, "type": "function"}
        function = {"name": name, "arguments": ""}
        return [
            _chunk({"role": "assistant", "tool_calls": [{**call, "function": function}]}),
            *(
                _chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                for piece in (arguments[:half], arguments[half:])
            ),
            _chunk({}, "tool_calls"),
        ]


def _said(text: str) -> list[dict[str, Any]]:
    """`text` word by word, as a model streams it."""
    words = text.split(" ")
    pieces = [w + " " for w in words[:-1]] + words[-1:]
    return [
        _chunk({"role": "assistant", "content": ""}),
        *(_chunk({"content": piece}) for piece in pieces),
        _chunk({}, "stop"),
    ]


def _chunk(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "standin",
    }
    if delta is not None:
        chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return chunk


def responder_server(standin: ChatStandin, **settings: Any) -> LiveServer:
    """A real server on the real engines (`settings` over the defaults), its `openai`
    responder at the stand-in."""
    loaded = load_settings(port=free_port(), log_level="warning", **settings)
    options = {"base_url": standin.base_url, "trust_env": False, "timeout_s": 10.0}
    engines = loaded.engines.model_copy(
        update={"responder": EngineSpec(name="openai", options=options)}
    )
    return start_server(loaded.model_copy(update={"engines": engines}))


def chat_fixtures(*, reuse_ids: bool = False, **settings: Any) -> tuple[Any, Any]:
    """A module's fixtures: `chat_standin, tool_server = chat_fixtures(...)` at its top level
    gives it a stand-in (`reuse_ids`) and a server (`settings`, as `responder_server`),
    both module-scoped."""

    @pytest.fixture(scope="module", name="chat_standin")
    def standin_fixture() -> Iterator[ChatStandin]:
        with ChatStandin(reuse_ids=reuse_ids) as standin:
            yield standin

    @pytest.fixture(scope="module", name="tool_server")
    def server_fixture(chat_standin: ChatStandin) -> Iterator[LiveServer]:
        live = responder_server(chat_standin, **settings)
        yield live
        stop_server(live)

    return standin_fixture, server_fixture
