"""The output side of a conversation session's `session.update`, and its model choice.

What the output takes from the new config: the voice (checked as at session.start), the
output rate (from the next response on), the response defaults. A config that names another
ASR model is given a lease on it first (loaded if need be), and the session's lease takes it
over only if the input side accepts the update too (conversation/input.py): an update is
applied whole or not at all, and a refused one leaves the session on the engines it had.

Apart from the session (pipeline/session.py) because these are the Realtime API's rules for
an update; the session only applies what they return.
"""

from __future__ import annotations

from collections.abc import Callable

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import StreamConfig
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.generations import Lease
from voxserve.types import SUPPORTED_OUTPUT_RATES


def check_output_update(
    ctx: SessionContext, old: StreamConfig, new: StreamConfig
) -> tuple[str, int]:
    """The voice and output rate a session started with `old` speaks with after `new`;
    raises a VoxError (not fatal) for what cannot change."""
    conversation = new.conversation
    if new.mode != old.mode or conversation is None:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER, "session.update cannot change the session's kind"
        )
    voice = ctx.engines.voice(new.voice)[0].id  # UNKNOWN_VOICE, not fatal
    defaults = conversation.response
    if defaults.voice is not None:
        ctx.engines.voice(defaults.voice)
    rate = new.output_sample_rate or ctx.settings.tts.output_sample_rate
    if rate not in SUPPORTED_OUTPUT_RATES:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"output sample rate {rate} is not supported"
        )
    return voice, rate


async def model_lease(ctx: SessionContext, old: StreamConfig, new: StreamConfig) -> Lease | None:
    """A lease with the ASR model `new` names, when it names another than `old` (loaded
    first: `unknown_model`, `model_unavailable`, not fatal); None when it is unchanged."""
    if new.model == old.model:
        return None
    models = ctx.models
    if models is None:
        raise VoxError(ErrorCode.INVALID_PARAMETER, "this session cannot change its model")
    return await models.lease(asr=new.model)


def apply_on(current: Lease, lease: Lease | None, apply: Callable[[], None]) -> None:
    """`apply` (the input side of the update) on the engines of `lease` (the model chosen
    now) when there is one: `current`, the session's lease, takes it over from the next
    decode on. A refusal (`apply` raises) puts the session back on the engines it had."""
    if lease is None:
        apply()  # refuses (raises) before it changes anything
        return
    before = current.generation.lease()  # the way back, should the update be refused
    current.take_over(lease)
    try:
        apply()
    except BaseException:
        current.take_over(before)
        raise
    before.release()
