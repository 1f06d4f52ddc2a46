"""A stand-in for an OpenAI-compatible chat-completions server (POST /v1/chat/completions,
streamed as server-sent events), built from OpenAI's published API: `choices[0].delta`
with `content` or `tool_calls` ({index, id, type, function {name, arguments}}), a finish
chunk, and with `stream_options.include_usage` a last chunk with no choices and `usage`
{prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens}.

What it answers is scripted by the conversation it is sent, as a local LLM server might:
- the last message a `tool` output: a sentence (ANSWER), unless the user asked for a
  loop ("again"): then the same tool once more, as a model that keeps calling tools;
- a user message that mentions the weather: a `get_weather` call whose id is always
  REUSED_ID (some local servers number calls per request, so every call has that id);
- anything else: GREETING.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REUSED_ID = "call_0"
ANSWER = "It is sunny there."
GREETING = "Hello there, how can I help?"
PROMPT_TOKENS = 123  # what its usage reports, whatever it was sent
CACHED_TOKENS = 64
COMPLETION_TOKENS = 9


class ChatStandIn:
    """The stand-in in a thread; `requests` holds every body it was sent."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                stand_in.requests.append(body)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for chunk in stand_in.chunks(body):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ChatStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages", [])
        users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
        last_user = users[-1] if users else ""
        answered = bool(messages) and messages[-1].get("role") == "tool"
        if answered and "again" not in last_user:
            out = [_choice({"role": "assistant", "content": ANSWER}), _choice({}, "stop")]
        elif "weather" in last_user or answered:
            call = {"index": 0, "id": REUSED_ID, "type": "function"}
            function = {"name": "get_weather", "arguments": ""}
            out = [
                _choice({"role": "assistant", "tool_calls": [{**call, "function": function}]}),
                _choice({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
                _choice({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
                _choice({}, "tool_calls"),
            ]
        else:
            out = [_choice({"role": "assistant", "content": GREETING}), _choice({}, "stop")]
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
                "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
            }
            out.append({"object": "chat.completion.chunk", "choices": [], "usage": usage})
        return out


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
