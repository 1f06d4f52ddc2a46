"""Optional OpenTelemetry spans per turn: voxserve.turn with vad, asr, responder, tts children.

Off by default and free when off: `make_tracer` returns None, nothing from opentelemetry is
imported, and the pipeline only checks `ctx.tracer is None`. On (settings.otel_enabled
or `voxserve serve --otel`, with the `otel` extra installed), the pipeline notes a few
timestamps per turn in a `TurnMarks` and the spans are made at the end of the turn with
those start and end times, so no span object lives across tasks. The exporter is whatever
the process's tracer provider has: `configure_sdk` sets up the OTLP exporter from the
standard OTEL_* env vars when available; tests install an in-memory exporter instead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# The child spans of a turn: name, start mark, end mark (a span is made when both exist).
SPANS = (
    ("vad", "vad.start", "vad.end"),
    ("asr", "vad.end", "asr.final"),
    ("responder", "responder.start", "responder.end"),
    ("tts", "tts.start", "tts.end"),
)


def now_ns() -> int:
    return time.time_ns()


@dataclass(slots=True)
class TurnMarks:
    """Wall-clock times (ns) of one turn's steps, named as in SPANS."""

    segment: int
    marks: dict[str, int] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.marks[name] = now_ns()


class TurnTracer:
    """Turns TurnMarks into spans on the current OpenTelemetry tracer provider."""

    def __init__(self, tracer_provider: Any = None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = trace.get_tracer("voxserve", tracer_provider=tracer_provider)

    def emit(self, turn: TurnMarks, *, trace_id: str, session_id: str, mode: str) -> None:
        marks = turn.marks
        if not marks:
            return
        start, end = min(marks.values()), max(marks.values())
        attributes: dict[str, Any] = {
            "voxserve.trace_id": trace_id,
            "voxserve.session_id": session_id,
            "voxserve.segment": turn.segment,
            "voxserve.mode": mode,
        }
        root = self._tracer.start_span("voxserve.turn", start_time=start, attributes=attributes)
        context = self._trace.set_span_in_context(root)
        for name, first, last in SPANS:
            if first in marks and last in marks:
                span = self._tracer.start_span(
                    name, context=context, start_time=marks[first], attributes=attributes
                )
                span.end(end_time=max(marks[first], marks[last]))
        root.end(end_time=end)


def configure_sdk() -> None:
    """Install an SDK tracer provider exporting over OTLP (OTEL_* env vars) when no provider
    is set yet and the exporter package is installed; otherwise spans go to the provider
    the process already has (or nowhere)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    provider = TracerProvider()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError:
        log.warning("otel enabled but no OTLP exporter installed; spans are not exported")
    else:
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def make_tracer(enabled: bool) -> TurnTracer | None:
    """None when off (no import); a TurnTracer when on and OpenTelemetry is installed."""
    if not enabled:
        return None
    try:
        return TurnTracer()
    except ImportError:
        log.warning("otel_enabled but opentelemetry is not installed: pip install 'voxserve[otel]'")
        return None
