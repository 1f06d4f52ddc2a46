"""The TTS stage deadlines of one synthesis's chunks (pipeline/synthesis/engine_chunks.py):
when a one-shot request's first chunk is due, and how far ahead of its playback a later
chunk is. Pure functions of the admission schedule and the clock."""

from __future__ import annotations

import time

import pytest

from voxserve.pipeline.scheduling.tts_lateness import ServiceRates, Ticket, TtsSchedule
from voxserve.pipeline.synthesis.engine_chunks import (
    FIRST_CHUNK_DUE_S,
    PLAYOUT_MARGIN_S,
    first_chunk_due,
    later_chunk_due,
)

MS_PER_CHAR = 5.0  # the prior: a first clause's engine time per character


def _schedule(one_shot_budget_s: float) -> TtsSchedule:
    rates = ServiceRates(MS_PER_CHAR / 1000, 0.2)
    return TtsSchedule(0.8, rates, time.monotonic, one_shot_budget_s)


def _costed(schedule: TtsSchedule, ticket: Ticket) -> Ticket:
    """The ticket with its next call's predicted cost set, as engine_chunks sets it."""
    schedule.call_cost(ticket)
    return ticket


def test_a_one_shot_first_chunk_is_due_when_admission_predicted_it_would_start() -> None:
    schedule = _schedule(one_shot_budget_s=10.0)
    ticket = schedule.open("piper/joe", "x" * 40, bulk=True)  # one clause: 0.2 s
    ticket.first_audio_at = time.monotonic() + 2.0  # admission's prediction
    due = first_chunk_due(_costed(schedule, ticket), bulk=True)
    assert due == pytest.approx(ticket.first_audio_at - 0.2)  # less its own cost


def test_a_first_chunk_predicted_at_once_is_due_no_sooner_than_a_live_one() -> None:
    schedule = _schedule(one_shot_budget_s=0.1)
    ticket = schedule.open("piper/joe", "x" * 40, bulk=True)
    ticket.first_audio_at = ticket.arrived
    asked = time.monotonic()
    due = first_chunk_due(_costed(schedule, ticket), bulk=True)
    assert asked + FIRST_CHUNK_DUE_S <= due <= time.monotonic() + FIRST_CHUNK_DUE_S
    live = schedule.open("piper/joe", "x" * 40, bulk=False)
    live.first_audio_at = live.arrived + 5.0
    assert (
        first_chunk_due(_costed(schedule, live), bulk=False) <= time.monotonic() + FIRST_CHUNK_DUE_S
    )


def test_a_later_chunk_is_due_its_own_cost_ahead_when_that_is_longer_than_the_last() -> None:
    """A first piece cut short ("Good morning,") is made in half the time of the clause
    after it: that clause's lead is its own cost, not the short piece's time."""
    assert later_chunk_due(10.0, took=0.1, cost_s=0.25) == pytest.approx(
        10.0 - PLAYOUT_MARGIN_S - 0.25
    )
    assert later_chunk_due(10.0, took=0.4, cost_s=0.25) == pytest.approx(
        10.0 - PLAYOUT_MARGIN_S - 0.4
    )
