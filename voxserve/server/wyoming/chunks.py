"""Wyoming `transcript-chunk` texts from a session's partial and final transcripts.

Chunks are append-only: a client shows them one after the other, and nothing can take
back text already sent. So a partial contributes only the words two successive partials
of its segment agree on (server/session/partials.py `stable_delta`), past what was sent; a
segment's final adds the rest of that segment. The chunks joined are `text`. Segments come
out in order: the partials of a later segment (VAD goes on while a final is decoded) wait
until the earlier final is in.

A final that disagrees with words already sent (the decoder changed its mind after they
looked stable) cannot retract them: the chunks keep the sent words and go on with the
final's words after as many words as were sent. The closing `transcript` event carries
`transcript` instead, the finals joined: the decoder's last word on each segment, which is
what Home Assistant acts on (it reads only `transcript`), so a partial Whisper got wrong
on too little audio ("Stop. Stop. Stop." for "Stop.", seen on the real model) never
reaches the intent. Without a disagreement the two are the same text. Segments (the
session's VAD may cut a long request in two) are joined with one space.
"""

from __future__ import annotations

from voxserve.server.session.partials import stable_delta


class TranscriptChunks:
    """The chunk texts of one request, in order; `text` is all of them joined,
    `transcript` the segments' finals joined."""

    def __init__(self) -> None:
        self.text = ""
        self.transcript = ""
        self.spoken_segments = 0  # segments whose final has text
        self._segment = 0  # the first segment without its final: the one being sent
        self._sent = ""  # that segment's text sent so far
        self._previous = ""  # its last partial

    def partial(self, segment: int, text: str) -> str | None:
        """The chunk a partial adds, or None."""
        if segment != self._segment:
            return None  # a late one of a closed segment, or an early one of the next
        delta = stable_delta(self._previous, text, self._sent)
        self._previous = text
        return self._append(delta) if delta else None

    def final(self, segment: int, text: str) -> str | None:
        """The chunk that completes a segment (its final text past what was sent), or None."""
        if segment < self._segment:
            return None
        if segment > self._segment:  # segments before it ended without text
            self._segment, self._sent = segment, ""
        text = text.strip()
        if text:
            self.transcript = f"{self.transcript} {text}" if self.transcript else text
            self.spoken_segments += 1
        if text.startswith(self._sent):
            rest = text[len(self._sent) :]
        else:  # the sent words stand; the final's words after as many follow them
            words = text.split()[len(self._sent.split()) :]
            rest = " ".join(words)
            if rest and self._sent and not self._sent[-1].isspace():
                rest = " " + rest
        self._previous = ""
        chunk = self._append(rest) if rest else None
        self._segment = segment + 1  # this segment is closed; the next starts clean
        self._sent = ""
        return chunk

    def _append(self, piece: str) -> str:
        chunk = piece
        if not self._sent and self.text and not self.text[-1].isspace():
            chunk = " " + piece.lstrip()  # a new segment: one space from the last
        self._sent += piece
        self.text += chunk
        return chunk
