"""--heterogeneity: spec parsing, reproducible heavy-tailed schedules, and the controller
(with a fake tc runner and a real child process for the duty cycle)."""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from dlcomm.launcher import dlcommrun
from dlcomm.launcher.dlcommrun import main as dlcommrun_main
from dlcomm.tools.emulation import compute_slowdown as cs
from dlcomm.tools.emulation.compute_slowdown import (
    ComputeSlowdown,
    ComputeStraggler,
    compute_speeds,
    emulated_host_index,
    format_compute_env,
    parse_compute_env,
)
from dlcomm.tools.emulation.heterogeneity import (
    CpuSlowdown,
    HeterogeneityController,
    LinkCongestion,
    congestion_schedule,
    cpu_speeds,
    parse_heterogeneity,
    rank_env,
)
from dlcomm.tools.emulation.plan import parse_spec


def test_parse_spec() -> None:
    spec = parse_heterogeneity("cpu=1:0.5:0.1,congest=*:100mbit:0.5:2,seed=3,period=0.2",
                               hosts=3)
    assert spec.cpu == (CpuSlowdown(1, 0.5, 0.1),)
    assert [c.host for c in spec.congest] == [0, 1, 2]
    assert spec.congest[0].rate_bits == 100_000_000 and spec.congest[0].on_mean_s == 0.5
    assert spec.seed == 3 and spec.period_s == 0.2


@pytest.mark.parametrize("bad", ["", "cpu=1", "cpu=1:1.5", "congest=1:fast", "cpu=9:0.5",
                                 "wobble=1", "period=100", "compute=1", "compute=1:0",
                                 "compute=1:1.5", "compute=1:0.01", "compute=1:-0.5",
                                 "compute=1:0.5:-0.1", "compute=4:0.5", "compute=x:0.5",
                                 "compute=1:0.5:0.1:2", "compute=1:0.5,compute=1:0.7",
                                 "compute=*:0.5,compute=2:0.7", "compute", "compute=1:nan"])
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


# --- compute= : a compute-only straggler run by the ranks ---------------------------------


def test_parse_compute_items() -> None:
    spec = parse_heterogeneity("compute=1:0.5:0.1,seed=3", hosts=4)
    assert spec.compute == (ComputeStraggler(1, 0.5, 0.1),)
    assert spec.cpu == () and spec.congest == () and spec.seed == 3
    spec = parse_heterogeneity("compute=*:0.8:0.2,cpu=0:0.5", hosts=3)
    assert [c.host for c in spec.compute] == [0, 1, 2] and spec.cpu == (CpuSlowdown(0, 0.5),)
    assert parse_heterogeneity("cpu=1:0.5", hosts=2).compute == ()


def test_parse_compute_error_names_item_and_reason() -> None:
    with pytest.raises(ValueError, match=r"'compute=1:1\.5'.*speed must be in"):
        parse_heterogeneity("compute=1:1.5", hosts=2)
    with pytest.raises(ValueError, match="outside the emulated cluster"):
        parse_heterogeneity("compute=2:0.5", hosts=2)
    with pytest.raises(ValueError, match="two compute= items"):
        parse_heterogeneity("compute=1:0.5,compute=1:0.9", hosts=2)
    with pytest.raises(ValueError, match="compute=H"):  # the help lists the new item
        parse_heterogeneity("computer=1:0.5", hosts=2)


def test_rank_env_round_trips() -> None:
    spec = parse_heterogeneity("compute=1:0.3:0.1,compute=3:0.7,seed=9,congest=0:1mbit",
                               hosts=4)
    env = rank_env(spec)
    assert list(env) == ["DLCOMM_EMULATE_COMPUTE"]
    assert parse_compute_env(env["DLCOMM_EMULATE_COMPUTE"]) == (list(spec.compute), 9)
    assert rank_env(parse_heterogeneity("cpu=1:0.5", hosts=2)) == {}
    items = [ComputeStraggler(0, 0.1 + 0.2, 1 / 3)]  # floats survive exactly
    assert parse_compute_env(format_compute_env(items, 0)) == (items, 0)
    for bad in ("1", "1:2", "x:0.5", "1:0.5,1:0.6", "1:0.5,seed=x"):
        with pytest.raises(ValueError, match="DLCOMM_EMULATE_COMPUTE"):
            parse_compute_env(bad)


def test_compute_speeds_are_seeded_and_bounded() -> None:
    item = ComputeStraggler(1, 0.5, 0.2)
    a = compute_speeds(item, 3, 3000)  # crosses the 1024-draw blocks of the iterator
    assert np.array_equal(a, compute_speeds(item, 3, 3000))
    assert not np.array_equal(a, compute_speeds(item, 4, 3000))
    assert not np.array_equal(a, compute_speeds(ComputeStraggler(2, 0.5, 0.2), 3, 3000))
    assert a.min() >= 0.3 - 1e-12 and a.max() <= 0.7 + 1e-12 and abs(a.mean() - 0.5) < 0.01
    assert a.std() > 0.1  # uniform on +-0.2: std 0.115
    wide = compute_speeds(ComputeStraggler(0, 0.5, 1.0), 0, 2000)  # clipped to [0.05, 1]
    assert wide.min() == 0.05 and wide.max() == 1.0
    assert np.all(compute_speeds(ComputeStraggler(0, 0.25), 0, 10) == 0.25)
    # not the cpu= duty-cycle stream: the two items draw independently
    assert not np.allclose(a[:100], cpu_speeds(CpuSlowdown(1, 0.5, 0.2), 3, 100))


class FakeTime:
    """A clock that only moves when slept on or advanced by the 'work' of a block."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_compute_slowdown_sleeps_before_each_block() -> None:
    t = FakeTime()
    slow = ComputeSlowdown(ComputeStraggler(1, 0.25), seed=0, clock=t.clock, sleep=t.sleep)
    assert slow.active
    work = [0.2, 0.4, 0.1, 0.3]
    starts = []
    for w in work:
        with slow:
            starts.append(t.now)
            t.now += w  # the compute of this block
    # no sleep before the first block (nothing measured yet); then (1/0.25 - 1) x previous
    assert t.sleeps == pytest.approx([3 * 0.2, 3 * 0.4, 3 * 0.1])
    assert slow.slept_s == pytest.approx(3 * 0.7) and slow.blocks == 4
    assert slow.last_compute_s == pytest.approx(0.3)  # measured without the sleep
    # the sleep happened before the block's work began: the block starts after it
    assert starts[1] == pytest.approx(100.0 + 0.2 + 0.6)
    # with constant work w, every block after the first takes w / speed including its sleep
    t2 = FakeTime()
    slow = ComputeSlowdown(ComputeStraggler(1, 0.25), clock=t2.clock, sleep=t2.sleep)
    for _ in range(5):
        with slow:
            t2.now += 0.2
    assert t2.now - 100.0 == pytest.approx(0.2 + 4 * 0.2 / 0.25)


def test_spread_slowdown_sleeps_at_ticks_for_the_current_work() -> None:
    t = FakeTime()
    slow = ComputeSlowdown(ComputeStraggler(1, 0.25), clock=t.clock, sleep=t.sleep)
    slow.tick()  # outside a block: nothing
    slow.spread = True
    for work in ([0.1, 0.2], [0.3, 0.0, 0.05]):
        with slow:
            for w in work:
                t.now += w
                slow.tick()
            t.now += 0.01  # work after the last tick: slept for at the end of the block
    # no sleep before a block, even after the first; each tick sleeps 3 x its own work
    # (zero work: no sleep), so the first block is slowed too
    assert t.sleeps == pytest.approx([0.3, 0.6, 0.03, 0.9, 0.15, 0.03])
    assert slow.last_compute_s == pytest.approx(0.36)  # the work, not the sleeps
    assert slow.slept_s == pytest.approx(3 * (0.31 + 0.36)) and slow.blocks == 2
    slow.tick()  # after the block: nothing
    assert len(t.sleeps) == 6
    slow.spread = False  # block mode again: ticks do nothing, the next block sleeps first
    with slow:
        slow.tick()
    assert t.sleeps[6:] == pytest.approx([3 * 0.36])


def test_compute_slowdown_uses_the_seeded_speeds_per_block() -> None:
    t = FakeTime()
    item = ComputeStraggler(2, 0.5, 0.3)
    slow = ComputeSlowdown(item, seed=7, clock=t.clock, sleep=t.sleep)
    speeds = compute_speeds(item, 7, 20)
    for _ in range(20):
        with slow:
            t.now += 0.1
    expected = [(1 / s - 1) * 0.1 for s in speeds[1:]]
    assert t.sleeps == pytest.approx([e for e in expected if e > 0])
    assert slow.speed == speeds[-1]


def test_compute_slowdown_records_a_block_that_raises() -> None:
    t = FakeTime()
    slow = ComputeSlowdown(ComputeStraggler(0, 0.5), clock=t.clock, sleep=t.sleep)
    with pytest.raises(KeyError), slow:
        t.now += 1.0
        raise KeyError("boom")
    with slow:
        pass
    assert t.sleeps == [1.0] and slow.blocks == 2
    with pytest.raises(RuntimeError, match="nest"), slow, slow:
        pass


def test_disabled_slowdown_touches_no_clock() -> None:
    def fail(*_a: object) -> float:
        raise AssertionError("a disabled slowdown must not time or sleep")

    slow = ComputeSlowdown(None, clock=fail, sleep=fail)
    with slow:
        pass
    assert not slow.active and slow.blocks == 0 and "off" in repr(slow)


def test_from_env_picks_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cs, "_warned", False)
    env = {"DLCOMM_EMULATE_COMPUTE": "1:0.5:0.1,2:0.25,seed=5"}
    one = ComputeSlowdown.from_env(env, "dlc-h1")
    assert one.active and one.item == ComputeStraggler(1, 0.5, 0.1) and one.seed == 5
    assert ComputeSlowdown.from_env(env, "dlc-h2").item == ComputeStraggler(2, 0.25)
    err = io.StringIO()
    assert not ComputeSlowdown.from_env(env, "dlc-h0", stderr=err).active  # not named
    assert not ComputeSlowdown.from_env({}, "dlc-h1", stderr=err).active  # no variable
    assert not ComputeSlowdown.from_env({"DLCOMM_EMULATE_COMPUTE": ""}, "dlc-h1",
                                        stderr=err).active
    assert err.getvalue() == ""  # nothing to say in any of these
    assert emulated_host_index("dlc-h12") == 12
    assert emulated_host_index("dlc-h") is None and emulated_host_index("mybox") is None
    with pytest.raises(ValueError, match="DLCOMM_EMULATE_COMPUTE"):
        ComputeSlowdown.from_env({"DLCOMM_EMULATE_COMPUTE": "1:7"}, "dlc-h1")


def test_from_env_off_an_emulated_host_says_so_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cs, "_warned", False)
    env = {"DLCOMM_EMULATE_COMPUTE": "1:0.5,seed=0"}
    err = io.StringIO()
    assert not ComputeSlowdown.from_env(env, "laptop", stderr=err).active
    assert not ComputeSlowdown.from_env(env, "laptop", stderr=err).active
    assert err.getvalue().count("no compute slowdown") == 1 and "'laptop'" in err.getvalue()


def test_dlcommrun_hands_compute_items_to_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """--heterogeneity compute=... reaches the ranks' env (and is -x forwarded); the
    controller runs nothing for it. The emulated cluster is faked (no root needed)."""
    spec = parse_spec("2x1gbit")
    fake = types.ModuleType("dlcomm.tools.emulation.cluster")
    fake.parse_spec = parse_spec

    @contextlib.contextmanager
    def cluster(s: object, slots_per_host: int = 1, *, pin_hosts: bool = False):  # noqa: ANN202
        yield types.SimpleNamespace(spec=spec, hosts_arg="dlc-h0:1,dlc-h1:1",
                                    mpirun_args=[], env={"DLCOMM_EMULATE": "2x1gbit"},
                                    mpirun_prefix=["nsrun", "dlc-h0"])

    fake.emulated_cluster = cluster
    monkeypatch.setitem(sys.modules, "dlcomm.tools.emulation.cluster", fake)
    monkeypatch.delenv("DLCOMM_EMULATE_COMPUTE", raising=False)
    seen: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(dlcommrun, "run_forwarding_signals",
                        lambda argv, env: seen.append((list(argv), dict(env))) or 0)
    assert dlcommrun_main(["--emulate", "2x1gbit", "--heterogeneity",
                           "compute=1:0.5:0.1,seed=4", "python", "t.py"]) == 0
    argv, env = seen[0]
    assert parse_compute_env(env["DLCOMM_EMULATE_COMPUTE"]) == (
        [ComputeStraggler(1, 0.5, 0.1)], 4)
    assert argv[argv.index("DLCOMM_EMULATE_COMPUTE") - 1] == "-x"
    assert dlcommrun_main(["--emulate", "2x1gbit", "--heterogeneity", "compute=2:0.5",
                           "python", "t.py"]) == 2  # host 2 is outside a 2-host cluster
    assert len(seen) == 1
