"""--heterogeneity: spec parsing, reproducible heavy-tailed schedules, and the controller
(with a fake tc runner and a real child process for the duty cycle)."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from dlcomm.launcher.dlcommrun import main as dlcommrun_main
from dlcomm.launcher.heterogeneity import (
    CpuSlowdown,
    HeterogeneityController,
    LinkCongestion,
    congestion_schedule,
    cpu_speeds,
    parse_heterogeneity,
)


def test_parse_spec() -> None:
    spec = parse_heterogeneity("cpu=1:0.5:0.1,congest=*:100mbit:0.5:2,seed=3,period=0.2",
                               hosts=3)
    assert spec.cpu == (CpuSlowdown(1, 0.5, 0.1),)
    assert [c.host for c in spec.congest] == [0, 1, 2]
    assert spec.congest[0].rate_bits == 100_000_000 and spec.congest[0].on_mean_s == 0.5
    assert spec.seed == 3 and spec.period_s == 0.2


@pytest.mark.parametrize("bad", ["", "cpu=1", "cpu=1:1.5", "congest=1:fast", "cpu=9:0.5",
                                 "wobble=1", "period=100"])
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_heterogeneity(bad, hosts=4)


def test_schedules_are_reproducible_and_heavy_tailed() -> None:
    item = LinkCongestion(2, 10**8, "100mbit", on_mean_s=1.0, off_mean_s=1.0)
    a = congestion_schedule(item, 7, 20000.0)
    assert a == congestion_schedule(item, 7, 20000.0)
    assert a != congestion_schedule(item, 8, 20000.0)
    durations = np.array([d for _, d in a])
    assert 0.7 < durations.mean() < 1.5  # Pareto(1.5): mean converges slowly
    assert durations.max() > 10 * np.median(durations)  # a heavy tail
    assert all(s2 >= s1 + d1 for (s1, d1), (s2, _) in zip(a, a[1:]))
    speeds = cpu_speeds(CpuSlowdown(1, 0.5, 0.2), 3, 1000)
    assert speeds.min() >= 0.3 - 1e-9 and speeds.max() <= 0.7 + 1e-9
    assert np.array_equal(speeds, cpu_speeds(CpuSlowdown(1, 0.5, 0.2), 3, 1000))


def test_controller_congests_and_restores_links() -> None:
    commands: list[list[str]] = []
    spec = parse_heterogeneity("congest=1:50mbit:0.05:0.05,seed=1", hosts=2)
    ctl = HeterogeneityController(spec, 10**9, run=commands.append, pids=lambda ns: [])
    ctl.start()
    time.sleep(0.6)
    ctl.stop()
    rates = [c[c.index("rate") + 1] for c in commands]
    assert "50000000bit" in rates and rates[-1] == "1000000000bit"
    assert all("dlc-h1" in c or "dlc-p1" in c for c in commands)


def test_controller_duty_cycles_a_process() -> None:
    """A busy child gets about SPEED of the CPU time it would get, and ends continued."""
    code = "import time\nt=time.process_time()\nwhile time.process_time()-t<30: pass"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        spec = parse_heterogeneity("cpu=1:0.25,period=0.1", hosts=2)
        ctl = HeterogeneityController(spec, 10**9, run=lambda c: None,
                                      pids=lambda ns: [child.pid])
        stopped_seen = False
        ctl.start()
        for _ in range(40):
            time.sleep(0.0237)
            with open(f"/proc/{child.pid}/stat") as f:
                stopped_seen |= f.read().split()[2] == "T"
        ctl.stop()
        assert stopped_seen
        time.sleep(0.05)
        with open(f"/proc/{child.pid}/stat") as f:
            assert f.read().split()[2] != "T"
        assert any("cpu at 0.25" in e for _, e in ctl.events)
    finally:
        child.kill()
        child.wait()


def test_dlcommrun_needs_emulate_for_heterogeneity(capsys) -> None:
    assert dlcommrun_main(["--heterogeneity", "cpu=1:0.5", "-np", "2", "true"]) == 2
    assert "--heterogeneity needs --emulate" in capsys.readouterr().err
