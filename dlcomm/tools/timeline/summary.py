"""Reads dlcomm timelines (Chrome trace JSON) and sums the time spent per phase and tensor.

Behind ``dlcomm timeline summary``. Accepts the files ``dlcomm.engine.timeline`` writes,
including one cut short by a crash (no closing ``]``), and Horovod-style ``B``/``E`` pairs.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlcomm.engine.timeline import PHASES


@dataclass(frozen=True)
class Span:
    """One phase of one tensor on one rank: [start_us, start_us + dur_us)."""

    rank: int
    tensor: str
    phase: str
    start_us: float
    dur_us: float
    unfinished: bool = False


@dataclass
class Trace:
    """The spans and instant markers of one or more timeline files."""

    spans: list[Span] = field(default_factory=list)
    instants: list[tuple[int, str, float]] = field(default_factory=list)  # rank, name, ts


@dataclass(frozen=True)
class PhaseStats:
    """Count and duration of one phase over all tensors and ranks (milliseconds)."""

    phase: str
    count: int
    total_ms: float
    mean_ms: float
    max_ms: float


@dataclass(frozen=True)
class TensorStats:
    """Time one tensor spent communicating, and in all phases (milliseconds)."""

    tensor: str
    communicate_count: int
    communicate_ms: float
    total_ms: float


@dataclass(frozen=True)
class TimelineSummary:
    """Per-phase and per-tensor totals of a trace."""

    phases: list[PhaseStats]
    tensors: list[TensorStats]  # sorted by communicate_ms, largest first
    ranks: list[int]
    span_ms: float
    unfinished: int


def _parse_events(text: str, path: str) -> list[dict[str, Any]]:
    """JSON events from a trace file's text, tolerating a missing closing bracket."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        repaired = text.rstrip().rstrip(",")
        try:
            data = json.loads(repaired + "]")
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path} is not a Chrome trace JSON file (written by DLCOMM_TIMELINE): {exc}"
            ) from None
    if isinstance(data, dict):
        data = data.get("traceEvents")
    if not isinstance(data, list):
        raise ValueError(f"{path} holds no trace event array")
    return [e for e in data if isinstance(e, dict)]


def load_trace(paths: str | Path | Sequence[str | Path]) -> Trace:
    """Load one or more timeline files (e.g. one per rank) into spans and markers."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise ValueError("give at least one timeline file")
    trace = Trace()
    for path in paths:
        if not isinstance(path, (str, Path)):
            raise TypeError(f"timeline path must be a string or Path, got {path!r}")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read timeline {str(path)!r}: {exc.strerror or exc}") from None
        _add_events(trace, _parse_events(text, str(path)))
    trace.spans.sort(key=lambda s: (s.start_us, s.rank, s.tensor))
    return trace


def _add_events(trace: Trace, events: Iterable[dict[str, Any]]) -> None:
    """Turn raw events into spans (X events and B/E pairs) and markers."""
    names: dict[tuple[Any, Any], str] = {}
    opened: dict[tuple[Any, Any, str], list[float]] = {}
    events = list(events)
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name"))
    for e in events:
        ph, pid, tid = e.get("ph"), e.get("pid"), e.get("tid")
        rank = pid if isinstance(pid, int) else 0
        tensor = names.get((pid, tid), f"tid {tid}")
        phase = str(e.get("name"))
        if ph == "X":
            unfinished = bool((e.get("args") or {}).get("unfinished"))
            trace.spans.append(Span(rank, tensor, phase, float(e["ts"]), float(e.get("dur", 0)),
                                    unfinished))
        elif ph == "B":
            opened.setdefault((pid, tid, phase), []).append(float(e["ts"]))
        elif ph == "E":
            stack = opened.get((pid, tid, phase))
            if stack:
                start = stack.pop()
                trace.spans.append(Span(rank, tensor, phase, start, float(e["ts"]) - start))
        elif ph in ("i", "I"):
            trace.instants.append((rank, phase, float(e["ts"])))


def phase_order(phase: str) -> tuple[int, str]:
    """Standard phases in pipeline order, others after them by name."""
    return (PHASES.index(phase), "") if phase in PHASES else (len(PHASES), phase)


def _spans_by_rank_and_tensor(spans: list[Span]) -> dict[tuple[int, str], list[Span]]:
    out: dict[tuple[int, str], list[Span]] = {}
    for s in spans:
        out.setdefault((s.rank, s.tensor), []).append(s)
    return out


def _covered_us(spans: list[Span]) -> float:
    """Microseconds covered by ``spans``, each instant once: phases nested in another (the
    compress and decompress inside a compressed tensor's communicate) are not counted
    twice."""
    total, end = 0.0, float("-inf")
    for s in sorted(spans, key=lambda s: s.start_us):
        start, stop = max(s.start_us, end), s.start_us + s.dur_us
        if stop > start:
            total += stop - start
        end = max(end, stop)
    return total


def summarize(trace: Trace) -> TimelineSummary:
    """Per phase: count, total, mean and max; per tensor: communicate time and total time
    (the time covered by any of its phases, summed over ranks)."""
    if not isinstance(trace, Trace):
        raise TypeError("summarize() takes a Trace (from load_trace())")
    by_phase: dict[str, list[float]] = {}
    by_tensor: dict[str, list[float]] = {}  # [communicate count, communicate us, total us]
    for s in trace.spans:
        by_phase.setdefault(s.phase, []).append(s.dur_us)
        t = by_tensor.setdefault(s.tensor, [0, 0.0, 0.0])
        if s.phase == "communicate":
            t[0] += 1
            t[1] += s.dur_us
    for (_, tensor), spans in _spans_by_rank_and_tensor(trace.spans).items():
        by_tensor[tensor][2] += _covered_us(spans)
    phases = [
        PhaseStats(p, len(d), sum(d) / 1e3, sum(d) / len(d) / 1e3, max(d) / 1e3)
        for p, d in sorted(by_phase.items(), key=lambda kv: phase_order(kv[0]))
    ]
    tensors = sorted(
        (TensorStats(name, int(c), us / 1e3, total / 1e3)
         for name, (c, us, total) in by_tensor.items()),
        key=lambda t: (-t.communicate_ms, -t.total_ms, t.tensor),
    )
    times = [s.start_us for s in trace.spans] + [s.start_us + s.dur_us for s in trace.spans]
    times += [ts for _, _, ts in trace.instants]
    span_ms = (max(times) - min(times)) / 1e3 if times else 0.0
    ranks = sorted({s.rank for s in trace.spans} | {r for r, _, _ in trace.instants})
    unfinished = sum(s.unfinished for s in trace.spans)
    return TimelineSummary(phases, tensors, ranks, span_ms, unfinished)


def format_summary(summary: TimelineSummary, top: int = 10) -> str:
    """The summary as two text tables: phases, then the ``top`` tensors by communicate time."""
    if not isinstance(summary, TimelineSummary):
        raise TypeError("format_summary() takes a TimelineSummary (from summarize())")
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"top must be a positive integer, got {top!r}")
    ranks = ", ".join(map(str, summary.ranks)) or "none"
    lines = [f"timeline: {summary.span_ms:.3f} ms, ranks {ranks}"]
    if summary.unfinished:
        lines.append(f"{summary.unfinished} phase(s) were still open when the timeline closed")
    lines += ["", f"{'phase':<14}{'count':>8}{'total ms':>14}{'mean ms':>12}{'max ms':>12}"]
    for p in summary.phases:
        lines.append(
            f"{p.phase:<14}{p.count:>8}{p.total_ms:>14.3f}{p.mean_ms:>12.3f}{p.max_ms:>12.3f}"
        )
    if not summary.phases:
        lines.append("(no phases recorded)")
    shown = summary.tensors[:top]
    width = max([len("tensor")] + [len(t.tensor) for t in shown]) + 2
    lines += [
        "",
        f"top {len(shown)} of {len(summary.tensors)} tensors by communicate time:",
        f"{'tensor':<{width}}{'count':>8}{'communicate ms':>16}{'all phases ms':>16}",
    ]
    for t in shown:
        lines.append(
            f"{t.tensor:<{width}}{t.communicate_count:>8}{t.communicate_ms:>16.3f}"
            f"{t.total_ms:>16.3f}"
        )
    return "\n".join(lines) + "\n"
