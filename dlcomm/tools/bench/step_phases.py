"""Where a training step's time goes, per rank: wall and calling-thread CPU time of named
phases (e.g. "before" = zero_grad and an emulated straggler's sleep, "compute" = forward
and backward, "step" = waiting for the all-reduce and the update), for the demo's
``--phase-times``.

CPU time next to wall time is the point: on a machine whose cores the ranks share, a phase
whose wall time exceeds its CPU time waited for a core (or slept), which is how the
heterogeneity benchmarks tell contention from work (docs/heterogeneity.md).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class StepPhases:
    """Records, per step, the wall and CPU seconds of each phase since the previous mark.

    Call ``start()`` at the top of a step, ``mark(name)`` at the end of each phase and
    ``end_step(samples)`` after the last. Disabled (``enabled=False``) every call is a
    no-op, so a training loop can call it unconditionally.
    """

    enabled: bool = True
    wall: Callable[[], float] = time.perf_counter
    cpu: Callable[[], float] = time.thread_time
    steps: list[dict[str, float]] = field(default_factory=list)
    _current: dict[str, float] | None = field(default=None, repr=False)
    _last: tuple[float, float] = field(default=(0.0, 0.0), repr=False)

    def start(self) -> None:
        """Begin a step (the time before it is not counted)."""
        if self.enabled:
            self._current = {}
            self._last = (self.wall(), self.cpu())

    def mark(self, phase: str) -> None:
        """End phase ``phase``: record the wall and CPU seconds since the previous mark."""
        if not self.enabled:
            return
        if self._current is None:
            raise RuntimeError("StepPhases.mark() before start()")
        if not isinstance(phase, str) or not phase or phase == "samples":
            raise ValueError(f"phase must be a non-empty name other than 'samples', got "
                             f"{phase!r}")
        if phase in self._current:
            raise ValueError(f"phase {phase!r} marked twice in one step")
        now = (self.wall(), self.cpu())
        self._current[phase] = now[0] - self._last[0]
        self._current[phase + ".cpu"] = now[1] - self._last[1]
        self._last = now

    def end_step(self, samples: int) -> None:
        """Close the step, which processed ``samples`` samples on this rank."""
        if not self.enabled:
            return
        if self._current is None:
            raise RuntimeError("StepPhases.end_step() before start()")
        self._current["samples"] = float(samples)
        self.steps.append(self._current)
        self._current = None

    def medians(self, skip: int = 0) -> dict[str, float]:
        """Median of every recorded quantity over the steps after the first ``skip`` (seconds
        for phases, a count for ``samples``); empty when there are none."""
        rows = self.steps[skip:]
        if not rows:
            return {}
        return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


def format_phase_medians(rank: int, medians: dict[str, float],
                         phases: Sequence[str]) -> str:
    """One line: rank, median samples, and each phase's median wall / CPU milliseconds."""
    if not medians:
        return f"rank {rank}: no steps timed"
    parts = [f"{p} {medians[p] * 1e3:.1f} / {medians[p + '.cpu'] * 1e3:.1f}"
             for p in phases if p in medians]
    return (f"rank {rank}: median step of {medians['samples']:.0f} samples, ms wall / CPU: "
            + ", ".join(parts))
