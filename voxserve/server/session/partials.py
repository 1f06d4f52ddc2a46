"""The words of a segment's partial transcripts a client may be shown for good: a door that
streams text it cannot take back (the Realtime API's transcription deltas, Wyoming's
`transcript-chunk`s) sends only what two successive partials agree on, past what it sent."""

from __future__ import annotations


def stable_prefix(previous: str, current: str) -> str:
    """The words two successive partials agree on: their common prefix, cut after its last
    whitespace (a word is stable once a space follows it in both)."""
    n = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        n += 1
    common = current[:n]
    cut = max(common.rfind(" "), common.rfind("\n"), common.rfind("\t"))
    return common[: cut + 1]


def stable_delta(previous: str, current: str, sent: str) -> str:
    """What a partial adds to the `sent` text of its segment: the words it and the
    `previous` partial agree on past `sent` ("" when none, or when they no longer start
    with `sent`: text sent is never taken back)."""
    stable = stable_prefix(previous, current)
    if len(stable) <= len(sent) or not stable.startswith(sent):
        return ""
    return stable[len(sent) :]
