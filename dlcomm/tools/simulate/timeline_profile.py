"""Compute times of a real run read from dlcomm's own timeline (``DLCOMM_TIMELINE``).

A training loop that marks ``forward``, ``backward`` and ``step`` with
``hvd.timeline_range`` (as ``examples/torch_synthetic_benchmark.py`` does) leaves, per
iteration, those spans on the ``(training)`` row, and the engine stamps when each gradient
was submitted (the start of its ``queued`` phase, named ``<schedule><n>.<parameter>``).
``timeline_compute`` takes the medians; ``workload_from_timeline`` puts them into a
workload: totals rescaled to the measured forward and backward, and, where the gradient
names match the workload's tensors, each layer's backward time from the measured ready
times.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path

from dlcomm.tools.simulate.workload import Layer, Workload

TRAINING_ROW = "(training)"  # dlcomm.training_timeline.TRAINING_ROW


@dataclasses.dataclass(frozen=True)
class TimelineCompute:
    """Median forward, backward and step seconds, and each gradient's median ready time
    after the start of backward (by parameter name)."""

    forward_s: float
    backward_s: float
    step_s: float
    ready_s: dict[str, float]
    iterations: int


def timeline_compute(paths: str | Path | Sequence[str | Path], rank: int = 0
                     ) -> TimelineCompute:
    """Read ``rank``'s spans from timeline files (see the module doc)."""
    from dlcomm.tools.timeline.summary import load_trace

    trace = load_trace(paths)
    mine = [s for s in trace.spans if s.rank == rank]
    training = sorted((s for s in mine if s.tensor == TRAINING_ROW and not s.unfinished),
                      key=lambda s: s.start_us)
    forwards = [s for s in training if s.phase == "forward"]
    backwards = [s for s in training if s.phase == "backward"]
    steps = [s for s in training if s.phase == "step"]
    if not forwards or not backwards:
        raise ValueError(f"no forward/backward spans on row {TRAINING_ROW!r} for rank {rank}: "
                         "mark them with hvd.timeline_range('forward') and ('backward')")
    queued = sorted((s for s in mine if s.phase == "queued"), key=lambda s: s.start_us)
    ready: dict[str, list[float]] = {}
    for b in backwards:
        end = b.start_us + b.dur_us
        for q in queued:
            if b.start_us <= q.start_us <= end:
                name = q.tensor.split(".", 1)[1] if "." in q.tensor else q.tensor
                ready.setdefault(name, []).append((q.start_us - b.start_us) / 1e6)
    return TimelineCompute(
        statistics.median(s.dur_us for s in forwards) / 1e6,
        statistics.median(s.dur_us for s in backwards) / 1e6,
        statistics.median(s.dur_us for s in steps) / 1e6 if steps else 0.0,
        {k: statistics.median(v) for k, v in ready.items()}, len(backwards))


def workload_from_timeline(base: Workload, measured: TimelineCompute) -> Workload:
    """``base``'s layers with the measured forward total (split as in ``base``) and backward
    (per layer from the ready times where every gradient-owning layer's tensors appear in
    the timeline, else split as in ``base``)."""
    fwd_scale = measured.forward_s / base.forward_s if base.forward_s > 0 else 0.0
    owners = [layer for layer in base.layers if layer.tensors]
    known = all(all(t.name in measured.ready_s for t in layer.tensors) for layer in owners)
    layers: list[Layer] = []
    if known and owners:
        previous = 0.0
        backward: dict[str, float] = {}
        for layer in reversed(base.layers):
            if not layer.tensors:
                backward[layer.name] = 0.0
                continue
            at = max(measured.ready_s[t.name] for t in layer.tensors)
            backward[layer.name] = max(at - previous, 0.0)
            previous = max(previous, at)
        first = next(layer for layer in base.layers if layer.tensors)
        backward[first.name] += max(measured.backward_s - previous, 0.0)
        for layer in base.layers:
            layers.append(dataclasses.replace(layer, forward_s=layer.forward_s * fwd_scale,
                                              backward_s=backward[layer.name]))
    else:
        bwd_scale = measured.backward_s / base.backward_s if base.backward_s > 0 else 0.0
        for layer in base.layers:
            layers.append(dataclasses.replace(layer, forward_s=layer.forward_s * fwd_scale,
                                              backward_s=layer.backward_s * bwd_scale))
    return dataclasses.replace(base, layers=tuple(layers))
