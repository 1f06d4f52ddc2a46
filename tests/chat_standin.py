"""A stand-in for an OpenAI-compatible chat-completions server (`POST /v1/chat/completions`,
streamed as server-sent events), built from OpenAI's published API: chunks of
`chat.completion.chunk` objects whose `choices[0].delta` carries `content` or `tool_calls`
(per call an `index`, on its first chunk an `id`, `type` and the function's `name`, then the
`arguments` in pieces), a `finish_reason` of `stop` or `tool_calls`, then `data: [DONE]`.

It plays the LLM behind voxserve's `openai` responder where a test needs tool calls: a request
that offers a tool it knows calls that tool (once per user turn); a request whose last message is
a tool's output, or that offers no tool, gets `ANSWER`. `reuse_ids` gives every call the same id,
as some local servers do."""

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


class ChatStandin:
    """The stand-in in a thread; `requests` holds every body it was sent, in order."""

    ANSWER = "It is sunny in Paris."

    def __init__(
        self,
        arguments: dict[str, dict[str, Any]] | None = None,
        *,
        reuse_ids: bool = False,
    ) -> None:
        self.arguments = arguments or {"get_weather": WEATHER_ARGUMENTS}
        self.reuse_ids = reuse_ids
        self.requests: list[dict[str, Any]] = []
        self._calls = 0
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

    def tool_messages(self, request: int = -1) -> list[dict[str, Any]]:
        return [m for m in self.requests[request]["messages"] if m.get("role") == "tool"]

    def chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages", [])
        offered = [t["function"]["name"] for t in body.get("tools", [])]
        known = [name for name in offered if name in self.arguments]
        if not known or (messages and messages[-1].get("role") == "tool"):
            words = self.ANSWER.split(" ")
            pieces = [w + " " for w in words[:-1]] + words[-1:]
            return [
                _chunk({"role": "assistant", "content": ""}),
                *(_chunk({"content": piece}) for piece in pieces),
                _chunk({}, "stop"),
            ]
        self._calls += 1
        call_id = "call_1" if self.reuse_ids else f"call_{self._calls}"
        arguments = json.dumps(self.arguments[known[0]])
        head = {"index": 0, "id": call_id, "type": "function"}
        half = len(arguments) // 2
        return [
            _chunk(
                {
                    "role": "assistant",
                    "tool_calls": [{**head, "function": {"name": known[0], "arguments": ""}}],
                }
            ),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[:half]}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]}),
            _chunk({}, "tool_calls"),
        ]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "standin",
        "choices": [choice],
    }


def responder_server(standin: ChatStandin, **settings: Any) -> LiveServer:
    """A real server on the real engines, its `openai` responder at the stand-in."""
    loaded = load_settings(port=free_port(), log_level="warning", **settings)
    options = {"base_url": standin.base_url, "trust_env": False, "timeout_s": 10.0}
    engines = loaded.engines.model_copy(
        update={"responder": EngineSpec(name="openai", options=options)}
    )
    return start_server(loaded.model_copy(update={"engines": engines}))


@pytest.fixture(scope="module")
def chat_standin() -> Iterator[ChatStandin]:
    standin = ChatStandin().start()
    yield standin
    standin.stop()


@pytest.fixture(scope="module")
def tool_server(chat_standin: ChatStandin) -> Iterator[LiveServer]:
    """Real engines, the `openai` responder at the chat-completions stand-in."""
    live = responder_server(chat_standin)
    yield live
    stop_server(live)
