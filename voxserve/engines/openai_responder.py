"""A responder that streams from any OpenAI-compatible chat-completions endpoint
(OpenAI, llama.cpp server, vLLM, Ollama, LM Studio, ...).

Tokens are regrouped into clauses before they are yielded: TTS voices whole clauses far
better than single tokens, and the first clause still arrives well before the full reply.
Conversation sessions call `converse` instead of `respond`: the whole conversation, tools
offered as chat-completions `function` tools, and the model's tool calls streamed back as
`ToolCallDelta` pieces between the text; with `include_usage` (the default) it asks for the
token counts (`stream_options.include_usage`) and yields them last as a `ReplyUsage`
(a Realtime response's `usage`). A server that refuses the option: `include_usage = false`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from typing import Any, TypeGuard

import httpx

from voxserve import __version__
from voxserve.engines.base import ChatMessage, ReplyRequest, ReplyUsage, ToolCallDelta
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import ToolSpec
from voxserve.text import ClauseBuffer
from voxserve.types import EngineInfo

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful voice assistant. Your replies are spoken aloud, so answer in one to "
    "three short sentences of plain conversational English, without lists, markdown, code "
    "or emoji."
)

_STAGE = "responder"
_SSE_FIELDS = ("data", "event", "id", "retry")


def _engine_error(message: str) -> VoxError:
    return VoxError(ErrorCode.ENGINE_ERROR, message, stage=_STAGE)


class OpenAIResponder:
    """Streams replies from an OpenAI-compatible `/chat/completions` endpoint.

    `api_key` is sent as a Bearer token only when given (local servers need none).
    `timeout_s` bounds connecting and each wait for the next bytes, not the whole reply.
    The HTTP client is created on first use, in the event loop that uses it; call
    `aclose()` at shutdown.
    """

    info: EngineInfo

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8080/v1",
        model: str = "default",
        api_key: str | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        temperature: float = 0.7,
        max_tokens: int | None = 256,
        timeout_s: float = 30.0,
        max_history_turns: int = 8,
        min_clause_chars: int = 24,
        max_chunk_chars: int = 200,
        max_connections: int = 256,
        trust_env: bool = True,
        include_usage: bool = True,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self._api_key = api_key
        self.system_prompt = system_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.max_history_turns = max(0, max_history_turns)
        self.min_clause_chars = min_clause_chars
        self.max_chunk_chars = max_chunk_chars
        self.max_connections = max_connections
        self.trust_env = trust_env
        self.include_usage = include_usage
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self.info = EngineInfo(
            kind="responder",
            name="openai",
            package="voxserve",
            version=__version__,
            license="Apache-2.0",
            model=model,
        )

    def __repr__(self) -> str:  # never show the API key
        return f"OpenAIResponder(base_url={self.base_url!r}, model={self.model!r})"

    def messages(self, text: str, history: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
        """System prompt, the last `max_history_turns` turns, then the new user text."""
        messages: list[dict[str, str]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        turns = history[-self.max_history_turns :] if self.max_history_turns else ()
        for user, assistant in turns:
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": assistant})
        messages.append({"role": "user", "content": text})
        return messages

    def request_body(self, text: str, history: Sequence[tuple[str, str]]) -> dict[str, Any]:
        return self._body(self.messages(text, history), self.max_tokens)

    def _body(self, messages: list[dict[str, Any]], max_tokens: int | None) -> dict[str, Any]:
        """A streamed chat-completions body: these messages, this token limit (None: none)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "temperature": self.temperature,
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return body

    def converse_body(self, request: ReplyRequest) -> dict[str, Any]:
        """The chat-completions body of a conversation session's reply: its instructions
        (else the system prompt), its messages as given (the session bounds them), its
        tools as `function` tools with the tool choice mapped, its token limit."""
        messages: list[dict[str, Any]] = []
        system = self.system_prompt if request.instructions is None else request.instructions
        if system:
            messages.append({"role": "system", "content": system})
        messages.extend(_chat_message(message) for message in request.messages)
        body = self._body(messages, request.max_output_tokens or self.max_tokens)
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            body["tools"] = [_tool(spec) for spec in request.tools]
            if request.tool_choice is not None:
                body["tool_choice"] = _tool_choice(request.tool_choice)
        return body

    async def respond(
        self, text: str, history: Sequence[tuple[str, str]]
    ) -> AsyncGenerator[str, None]:
        """Stream the reply in clause-sized pieces.

        Raises VoxError(ENGINE_ERROR) on any transport, HTTP or protocol failure. Closing
        this generator early (barge-in) closes the HTTP stream with it.
        """
        stream = self._stream(self.request_body(text, history))
        try:
            async for piece in stream:
                if isinstance(piece, str):  # no tools were offered: calls are not expected
                    yield piece
        finally:
            await stream.aclose()

    def converse(
        self, request: ReplyRequest
    ) -> AsyncGenerator[str | ToolCallDelta | ReplyUsage, None]:
        """Stream the reply of a conversation session: clause-sized text pieces and the
        tool calls' pieces (`delta.tool_calls`) as they come. Errors and closing as for
        `respond`."""
        return self._stream(self.converse_body(request))

    async def _stream(
        self, body: dict[str, Any]
    ) -> AsyncGenerator[str | ToolCallDelta | ReplyUsage, None]:
        client = self._get_client()
        chunker = ClauseBuffer(
            min_clause_chars=self.min_clause_chars, max_chunk_chars=self.max_chunk_chars
        )
        usage: ReplyUsage | None = None
        try:
            async with client.stream("POST", self.url, json=body) as response:
                if not 200 <= response.status_code < 300:
                    raise _engine_error(
                        f"responder server answered HTTP {response.status_code} for POST {self.url}"
                    )
                parser = _SseParser()
                async for line in response.aiter_lines():
                    if parser.done:
                        if line.strip():  # more after [DONE]: stop; the close drops it
                            break
                        continue  # drain the tail so the connection can be reused
                    payload = parser.feed(line)
                    if payload is not None:
                        for piece in _pieces(payload, chunker):
                            if isinstance(piece, ReplyUsage):
                                usage = piece  # last, after the text still in the chunker
                            else:
                                yield piece
                payload = parser.end()
                if payload is not None:
                    for piece in _pieces(payload, chunker):
                        if isinstance(piece, ReplyUsage):
                            usage = piece
                        else:
                            yield piece
                if not parser.done and not parser.events:
                    raise _engine_error("responder server sent no server-sent events")
        except httpx.TimeoutException as exc:
            raise _engine_error(
                f"responder server at {self.base_url} did not answer within {self.timeout_s} s"
            ) from exc
        except httpx.ConnectError as exc:
            raise _engine_error(f"cannot connect to responder server at {self.base_url}") from exc
        except httpx.HTTPError as exc:
            raise _engine_error(
                f"connection to responder server at {self.base_url} failed ({type(exc).__name__})"
            ) from exc
        rest = chunker.flush()
        if rest:
            yield rest
        if usage is not None:
            yield usage

    async def aclose(self) -> None:
        """Close the HTTP client (and its pooled connections); a later call reopens one."""
        client, self._client = self._client, None
        loop, self._client_loop = self._client_loop, None
        if client is None or client.is_closed:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - aclose is always awaited
            running = None
        if loop is running:
            await client.aclose()
        # A client from another (finished) loop cannot be closed from here; dropping it is
        # all that is left, its sockets went with that loop.

    def _get_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client.is_closed or self._client_loop is not loop:
            headers = {"Accept": "text/event-stream"}
            if self._api_key:
                headers["Authorization"] = f"Bearer {self._api_key}"
            self._client = httpx.AsyncClient(
                headers=headers,
                timeout=httpx.Timeout(self.timeout_s),
                limits=httpx.Limits(
                    max_connections=self.max_connections,
                    max_keepalive_connections=min(self.max_connections, 32),
                ),
                trust_env=self.trust_env,
            )
            self._client_loop = loop
        return self._client


class _SseParser:
    """Just enough of the server-sent-events format: `data:` lines joined until a blank
    line; comments and event/id/retry fields ignored; anything else is a protocol error."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self.events = 0
        self.done = False

    def feed(self, line: str) -> str | None:
        """One line (without its ending); returns an event's data when one completes."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, sep, value = line.partition(":")
        if field not in _SSE_FIELDS or not sep:
            raise _engine_error("responder server sent a malformed event stream")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def end(self) -> str | None:
        """End of the body: an unterminated last event still counts."""
        return self._dispatch()

    def _dispatch(self) -> str | None:
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        self.events += 1
        if data.strip() == "[DONE]":
            self.done = True
            return None
        return data


def _chat_message(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["content"] = message.content or None  # a call with no text: content null
        out["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    if message.call_id is not None:
        out["tool_call_id"] = message.call_id
    return out


def _tool(spec: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name}
    if spec.description:
        function["description"] = spec.description
    if spec.parameters is not None:
        function["parameters"] = spec.parameters
    return {"type": "function", "function": function}


def _tool_choice(choice: str) -> str | dict[str, Any]:
    """auto, none and required as they are; any other value names the function to call."""
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _pieces(payload: str, chunker: ClauseBuffer) -> list[str | ToolCallDelta | ReplyUsage]:
    """What one chunk adds: clauses its text completed, then its tool calls' pieces (the
    text before a call is flushed first, so the order of the stream is kept), then the
    reply's token counts if the chunk has them (`usage`: the last chunk, or with it)."""
    chunk = _chunk(payload)
    usage = _usage(chunk.get("usage"))
    delta = _delta(chunk)
    if delta is None:
        return [usage] if usage else []
    pieces: list[str | ToolCallDelta | ReplyUsage] = []
    content = delta.get("content")
    if isinstance(content, str) and content:
        pieces.extend(chunker.feed(content))
    calls = _tool_call_deltas(delta.get("tool_calls"))
    if calls:
        rest = chunker.flush()
        if rest:
            pieces.append(rest)
        pieces.extend(calls)
    if usage is not None:
        pieces.append(usage)
    return pieces


def _usage(raw: object) -> ReplyUsage | None:
    """Chat completions' `usage` ({prompt_tokens, completion_tokens,
    prompt_tokens_details.cached_tokens}); None when absent or not counts (some servers
    send null, or partial objects: those are taken as absent, never as an error)."""
    if not isinstance(raw, dict):
        return None
    prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
    if not _count(prompt) or not _count(completion):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return ReplyUsage(prompt, completion, cached if _count(cached) else 0)


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40


def _tool_call_deltas(raw: object) -> list[ToolCallDelta]:
    """`delta.tool_calls` as OpenAI and vLLM stream them: per call an `index`; its first
    piece has `id` and `function.name`, every piece some of `function.arguments`."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _engine_error("responder server sent malformed 'tool_calls'")
    deltas: list[ToolCallDelta] = []
    for entry in raw:
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(function, dict | None):
            raise _engine_error("responder server sent malformed 'tool_calls'")
        index, call_id = entry.get("index", 0), entry.get("id")
        function = function or {}
        name, arguments = function.get("name"), function.get("arguments")
        if (
            not isinstance(index, int)
            or not isinstance(call_id, str | None)
            or not isinstance(name, str | None)
            or not isinstance(arguments, str | None)
        ):
            raise _engine_error("responder server sent malformed 'tool_calls'")
        deltas.append(ToolCallDelta(index, call_id or None, name or None, arguments or ""))
    return deltas


def _chunk(payload: str) -> dict[str, Any]:
    """One event's JSON object."""
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise _engine_error("responder server sent an event that is not JSON") from None
    if not isinstance(chunk, dict):
        raise _engine_error("responder server sent an event that is not a JSON object")
    return chunk


def _delta(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """The `delta` of one chat-completion chunk (None for usage or final chunks)."""
    error = chunk.get("error")
    if error is not None:
        kind = (error.get("type") or error.get("code")) if isinstance(error, dict) else None
        detail = f" ({kind})" if isinstance(kind, str) and len(kind) <= 64 else ""
        raise _engine_error(f"responder server reported an error in the stream{detail}")
    choices = chunk.get("choices")
    if choices is None:
        return None
    if not isinstance(choices, list):
        raise _engine_error("responder server sent a chunk with malformed 'choices'")
    if not choices:
        return None
    first = choices[0]
    delta = first.get("delta") if isinstance(first, dict) else None
    if delta is None:
        return None
    if not isinstance(delta, dict):
        raise _engine_error("responder server sent a chunk with a malformed 'delta'")
    return delta
