"""Conversation items both ways: a Realtime `conversation.item.create` -> CreateItem, a
`response.create` -> CreateResponse, and the session's `Item` -> the item object of server
events (GA content part names, or beta's). Pure (realtime_api/codec.py, realtime_api/events.py)."""

from __future__ import annotations

from typing import Any

from voxserve.events import UNSET, CreateItem, CreateResponse, Item, ResponseOptions, Role
from voxserve.server.realtime_api.session import BETA_FORMATS, RealtimeWire, voice_id
from voxserve.server.realtime_api.update import (
    MAX_TEXT,
    ga_format,
    max_tokens,
    modalities_of,
    tool_choice_of,
    tools_of,
    voice_of,
)
from voxserve.server.session import fields as f

Obj = dict[str, Any]
MAX_METADATA = 16  # a response's metadata: OpenAI's bounds (pairs, key and value lengths)
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
ROLES: dict[str, Role] = {"user": "user", "assistant": "assistant", "system": "system"}
# The content parts a message of each role may have, and the field holding its text (an
# audio part's transcript: voxserve takes no audio items, only what was said).
PARTS: dict[str, dict[str, str]] = {
    "user": {"input_text": "text", "input_audio": "transcript"},
    "system": {"input_text": "text"},
    "assistant": {
        "output_text": "text",
        "output_audio": "transcript",
        "text": "text",
        "audio": "transcript",
    },
}


def create_item(data: Obj) -> CreateItem:
    """conversation.item.create: a message (its parts' text joined), function_call or
    function_call_output."""
    item = f.obj(data, "item", "", required=True)
    assert item is not None
    path = "item"
    kind = f.choice(item, "type", path, ("message", "function_call", "function_call_output"))
    item_id = f.an_id(item, "id", path)
    previous = f.an_id(data, "previous_item_id", "")
    if kind in ("function_call", "function_call_output"):
        call = kind == "function_call"  # else the call's output
        return CreateItem(
            "function_call" if call else "function_call_output",
            item_id,
            previous,
            call_id=f.an_id(item, "call_id", path, required=True),
            name=f.string(item, "name", path, required=True, limit=f.MAX_ID) if call else None,
            arguments=(f.string(item, "arguments", path, limit=MAX_TEXT) or "") if call else "",
            output=(f.string(item, "output", path, required=True, limit=MAX_TEXT) or "")
            if not call
            else "",
        )
    if kind is None:
        raise f.invalid("item.type is required")
    role = f.choice(item, "role", path, tuple(ROLES))
    if role is None:
        raise f.invalid("item.role is required")
    parts = f.listed(item, "content", path) or []
    texts = []
    for i, part in enumerate(parts):
        p = f"item.content[{i}]"
        if not isinstance(part, dict):
            raise f.invalid(f"{p} must be an object")
        part_type = part.get("type")
        key = PARTS[role].get(part_type) if isinstance(part_type, str) else None
        if key is None:
            allowed = ", ".join(PARTS[role])
            raise f.bad_value(f"{p}.type", f"must be one of {allowed} for a {role} message")
        text = f.string(part, key, p, limit=MAX_TEXT)
        if text is None:
            raise f.bad_value(f"{p}.{key}", "is required: voxserve takes no audio items")
        texts.append(text)
    return CreateItem("message", item_id, previous, role=ROLES[role], text=" ".join(texts))


def create_response(data: Obj, wire: RealtimeWire) -> CreateResponse:
    """response.create's overrides (GA or beta names) of the session's defaults."""
    response = f.obj(data, "response", "")
    if response is None:
        return CreateResponse()
    path = "response"
    if response.get("input"):
        raise f.bad_value(f"{path}.input", "is not supported: a response reads the conversation")
    conversation = f.string(response, "conversation", path, limit=f.MAX_ID)
    if conversation not in (None, "auto", "none"):
        raise f.bad_value(f"{path}.conversation", 'must be "auto" or "none"')
    modalities = f.listed(response, "output_modalities", path)
    beta_modalities = f.listed(response, "modalities", path)
    voice = voice_of(response, path)
    audio = f.obj(response, "audio", path)
    output = f.obj(audio, "output", f"{path}.audio") if audio else None
    if output is not None:
        voice = voice_of(output, f"{path}.audio.output") or voice
        if output.get("format") is not None:
            _same_format(ga_format(output["format"], f"{path}.audio.output.format"), wire)
    beta_format = f.choice(response, "output_audio_format", path, tuple(BETA_FORMATS))
    if beta_format is not None:
        _same_format(BETA_FORMATS[beta_format], wire)
    tokens_key = (
        "max_output_tokens" if "max_output_tokens" in response else "max_response_output_tokens"
    )
    tools = f.listed(response, "tools", path)
    options = ResponseOptions(
        instructions=f.string(response, "instructions", path, limit=MAX_TEXT),
        tools=None if tools is None else tools_of(tools, f"{path}.tools"),
        tool_choice=(
            None
            if response.get("tool_choice") is None
            else tool_choice_of(response["tool_choice"], path)
        ),
        output_modalities=(
            modalities_of(modalities, f"{path}.output_modalities", beta=False)
            if modalities is not None
            else modalities_of(beta_modalities, f"{path}.modalities", beta=True)
            if beta_modalities is not None
            else None
        ),
        voice=None if voice is None else voice_id(voice, wire.installed),
        max_output_tokens=max_tokens(response.get(tokens_key), f"{path}.{tokens_key}"),
        in_conversation=conversation != "none",
        voice_name=voice,
        metadata=metadata_of(response.get("metadata"), f"{path}.metadata"),
    )
    return CreateResponse(options)


def metadata_of(value: object, path: str) -> tuple[tuple[str, str], ...] | None:
    """A response's `metadata` as OpenAI takes it: at most MAX_METADATA string pairs, keys
    of at most MAX_METADATA_KEY characters, values of at most MAX_METADATA_VALUE; echoed on
    its response.created and response.done (LiveKit's generate_reply matches its
    `client_event_id` there). null: none."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise f.invalid(f"{path} must be an object of string keys and values")
    if len(value) > MAX_METADATA:
        raise f.bad_value(path, f"has {len(value)} keys; at most {MAX_METADATA}")
    pairs = []
    for key, text in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise f.bad_value(path, f"has a key longer than {MAX_METADATA_KEY} characters")
        if not isinstance(text, str):
            raise f.invalid(f"{path}.{key} must be a string")
        if len(text) > MAX_METADATA_VALUE:
            raise f.bad_value(f"{path}.{key}", f"is longer than {MAX_METADATA_VALUE} characters")
        pairs.append((key, text))
    return tuple(pairs)


def _same_format(fmt: str, wire: RealtimeWire) -> None:
    if fmt != wire.latest.output_format:
        raise f.bad_value(
            "response.audio.output.format",
            "must be the session's: change it with session.update",
        )


# --- items as server events carry them ----------------------------------------------------


def item_dict(item: Item, *, beta: bool) -> Obj:
    """The session's item in Realtime's shape."""
    out: Obj = {"id": item.id, "object": "realtime.item", "type": item.kind, "status": item.status}
    if item.kind == "message":
        role = "user" if item.role is UNSET else item.role
        out["role"] = role
        out["content"] = [_part(role, item, beta)]
    elif item.kind == "function_call":
        out |= {
            "call_id": _text(item.call_id),
            "name": _text(item.name),
            "arguments": _text(item.arguments),
        }
    else:
        out |= {"call_id": _text(item.call_id), "output": _text(item.output)}
    return out


def _part(role: str, item: Item, beta: bool) -> Obj:
    if role == "assistant":
        if item.audio:
            return {"type": "audio" if beta else "output_audio", "transcript": item.text or ""}
        return {"type": "text" if beta else "output_text", "text": item.text or ""}
    if item.audio:
        return {"type": "input_audio", "transcript": item.text}
    return {"type": "input_text", "text": item.text or ""}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
