"""PNG charts (matplotlib, Agg backend: no display needed): latency CDFs per step, P99 and
server CPU against concurrency for a ramp, and chunk size against latency and WER."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from voxserve.bench.records import METRICS

MAX_PANELS = 6


def _nan(values: Sequence[Any]) -> list[float]:
    """Missing values as NaN, which matplotlib leaves as a gap in the line."""
    return [float(v) if v is not None else float("nan") for v in values]


def latency_cdf(path: Path, steps: Sequence[tuple[str, Mapping[str, list[float]]]]) -> Path | None:
    """One panel per latency metric, one line per step: the share of samples <= x ms."""
    metrics = [m for m in METRICS if any(samples.get(m) for _, samples in steps)][:MAX_PANELS]
    if not metrics:
        return None
    cols = min(3, len(metrics))
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for label, samples in steps:
            values = sorted(v * 1000 for v in samples.get(metric, []))
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
        ax.set_title(metric)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction <= x")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def ramp(path: Path, records: Sequence[Mapping[str, Any]], metric: str, budget_ms: float) -> Path:
    """P99 of the budget metric (left) and server CPU % (right) against streams."""
    streams = [r["streams"] for r in records]
    p99 = [(r["latency_ms"].get(metric) or {}).get("p99") for r in records]
    cpu = [(r.get("server") or {}).get("cpu_percent") for r in records]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(streams, _nan(p99), "o-", label=f"{metric} P99")
    ax.axhline(budget_ms, color="red", linestyle="--", label=f"budget {budget_ms:g} ms")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel(f"{metric} P99 (ms)")
    ax.set_yscale("log")
    right = ax.twinx()
    right.plot(
        streams,
        _nan(cpu),
        "s--",
        color="gray",
        label="server CPU %",
    )
    right.set_ylabel("server CPU % (100 = one core)")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def turns(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Turn latency P50/P99 (left) and the premature-turn rate (right) per turn detection:
    the trade-off between answering soon and answering someone who only paused."""
    labels = [str(r["label"]).split(" streams ")[-1] for r in rows]
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(x, _nan([r.get("turn_p50_ms") for r in rows]), "o-", label="turn P50 (ms)")
    ax.plot(x, _nan([r.get("turn_p99_ms") for r in rows]), "o--", label="turn P99 (ms)")
    ax.set_xticks(x, labels, rotation=15, fontsize=8)
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    rates = [r.get("premature_turn_rate") for r in rows]
    right.bar(x, _nan([None if v is None else v * 100 for v in rates]), alpha=0.25, color="red")
    right.set_ylabel("premature turns (%)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def sweep(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Partial latency and WER against chunk_ms (rows with partials on)."""
    on = [r for r in rows if r["partials"]]
    x = [r["chunk_ms"] for r in on]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, style in (("ttfp_p50_ms", "o-"), ("ttfp_p99_ms", "o--"), ("final_p50_ms", "s-")):
        ax.plot(x, _nan([r.get(key) for r in on]), style, label=key)
    ax.set_xlabel("chunk_ms (partial re-decode interval)")
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    right.plot(
        x,
        _nan([r.get("wer") for r in on]),
        "^:",
        color="purple",
        label="WER",
    )
    right.set_ylabel("WER")
    lines, more = ax.get_legend_handles_labels(), right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
