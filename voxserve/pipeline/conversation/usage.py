"""A response's tokens, counted as the Realtime API reports them (response.done's `usage`).

Audio at the rates OpenAI publishes for its realtime models ("Managing costs": a user
message's audio is 1 token per 100 ms, an assistant message's 1 token per 50 ms): the input
is every audio item of the conversation the response read (the user's turns as long as
their speech, the replies as long as their audio, cut where the client truncated one), the
output the response's own audio. voxserve's responder reads and writes text, so these are
what OpenAI would count for the same audio, not what a model took.

Text as the responder's server counted it (chat completions' `usage`, which the `openai`
responder asks for); a responder that reports none (rules, echo, a server without usage)
gets an estimate, 4 characters a token (OpenAI's rule of thumb for English), marked
`estimated`.
"""

from __future__ import annotations

import json
import math

from voxserve.engines.base import ReplyRequest, ReplyUsage
from voxserve.events import Usage

USER_AUDIO_MS_PER_TOKEN = 100
ASSISTANT_AUDIO_MS_PER_TOKEN = 50
CHARS_PER_TOKEN = 4


def audio_tokens(audio_ms: int, role: str) -> int:
    """The tokens of `audio_ms` of a `role` message's audio."""
    per = ASSISTANT_AUDIO_MS_PER_TOKEN if role == "assistant" else USER_AUDIO_MS_PER_TOKEN
    return math.ceil(max(0, audio_ms) / per)


def estimate_tokens(chars: int) -> int:
    return math.ceil(max(0, chars) / CHARS_PER_TOKEN)


def request_chars(request: ReplyRequest) -> int:
    """The characters of what a responder reads: instructions, messages, tool calls and
    the tools offered (their JSON)."""
    chars = len(request.instructions or "")
    for message in request.messages:
        chars += len(message.content)
        for call in message.tool_calls:
            chars += len(call.name) + len(call.arguments)
    for tool in request.tools:
        chars += len(tool.name) + len(tool.description)
        chars += len(json.dumps(tool.parameters)) if tool.parameters else 0
    return chars


def usage_of(
    request: ReplyRequest | None,
    reported: ReplyUsage | None,
    *,
    input_audio: int,
    output_chars: int,
    output_audio_ms: int,
) -> Usage:
    """The response's Usage (module docstring): `input_audio` the tokens of the audio items
    it read, `output_chars` what it wrote (text and tool arguments), `output_audio_ms`
    the audio it made. A response that never asked its responder (cancelled first) read
    nothing and wrote nothing."""
    output_audio = audio_tokens(output_audio_ms, "assistant")
    if request is None:
        return Usage(output_audio=output_audio)
    if reported is not None:
        return Usage(
            input_text=reported.input_tokens,
            input_audio=input_audio,
            input_cached=min(reported.cached_tokens, reported.input_tokens),
            output_text=reported.output_tokens,
            output_audio=output_audio,
        )
    return Usage(
        input_text=estimate_tokens(request_chars(request)),
        input_audio=input_audio,
        output_text=estimate_tokens(output_chars),
        output_audio=output_audio,
        estimated=True,
    )
