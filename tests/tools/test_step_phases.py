"""StepPhases: per-step wall and CPU time of named phases (the demo's --phase-times)."""
from __future__ import annotations

import pytest

from dlcomm.tools.bench.step_phases import StepPhases, format_phase_medians


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make() -> tuple[StepPhases, FakeClock, FakeClock]:
    wall, cpu = FakeClock(), FakeClock()
    return StepPhases(wall=wall, cpu=cpu), wall, cpu


def run_step(ph: StepPhases, wall: FakeClock, cpu: FakeClock, before: float, compute: float,
             compute_cpu: float, samples: int) -> None:
    ph.start()
    wall.t += before  # a sleep: wall time, no CPU
    ph.mark("before")
    wall.t += compute
    cpu.t += compute_cpu
    ph.mark("compute")
    ph.end_step(samples)


def test_records_wall_and_cpu_per_phase_and_takes_medians_after_skip() -> None:
    ph, wall, cpu = make()
    wall.t = cpu.t = 100.0  # time before start() is not counted
    run_step(ph, wall, cpu, 5.0, 9.0, 9.0, 64)  # a warm-up step, skipped below
    for before, compute, used, samples in [(0.1, 0.3, 0.2, 32), (0.2, 0.5, 0.4, 30),
                                           (0.3, 0.4, 0.3, 34)]:
        run_step(ph, wall, cpu, before, compute, used, samples)
    assert ph.steps[0] == {"before": 5.0, "before.cpu": 0.0, "compute": 9.0,
                           "compute.cpu": 9.0, "samples": 64.0}
    m = ph.medians(skip=1)
    assert m["before"] == pytest.approx(0.2) and m["before.cpu"] == 0.0
    assert m["compute"] == pytest.approx(0.4) and m["compute.cpu"] == pytest.approx(0.3)
    assert m["samples"] == 32.0
    assert ph.medians(skip=4) == {}
    line = format_phase_medians(1, m, ["before", "compute", "step"])
    assert line == ("rank 1: median step of 32 samples, ms wall / CPU: before 200.0 / 0.0, "
                    "compute 400.0 / 300.0")
    assert format_phase_medians(0, {}, ["before"]) == "rank 0: no steps timed"


def test_disabled_is_a_no_op() -> None:
    ph = StepPhases(enabled=False)
    ph.mark("compute")  # no start() needed: nothing is recorded
    ph.end_step(3)
    assert ph.steps == [] and ph.medians() == {}


def test_misuse_is_reported() -> None:
    ph, _, _ = make()
    with pytest.raises(RuntimeError, match="before start"):
        ph.mark("compute")
    with pytest.raises(RuntimeError, match="before start"):
        ph.end_step(1)
    ph.start()
    ph.mark("compute")
    with pytest.raises(ValueError, match="marked twice"):
        ph.mark("compute")
    for bad in ("", "samples", 3):
        with pytest.raises(ValueError, match="non-empty name"):
            ph.mark(bad)  # type: ignore[arg-type]
