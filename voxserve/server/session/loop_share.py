"""What one connection's input may hold the event loop for at a time, on every door.

A single read can carry tens of thousands of tiny frames or events (empty WebSocket pings,
Wyoming `ping` lines), each a few microseconds of Python. Handled in one go they held the
loop, and every other stream with it, for a third of a second per read here (over a second
on a busy machine). Each door's reader hands the loop back once its turn is spent: the
WebSocket protocol pauses reading and goes on at the loop's next turn
(server/websocket/fastpath.py), the Wyoming handler yields between events
(server/wyoming/handler.py).
"""

from __future__ import annotations

import time

TURN_S = 0.004  # a connection's turn of the loop


def turn_ends() -> float:
    """When a turn starting now is spent (time.perf_counter())."""
    return time.perf_counter() + TURN_S
