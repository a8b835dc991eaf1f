"""Time-varying heterogeneity for ``dlcommrun --emulate``: compute stragglers and congested
links, reproducible from a seed (``--heterogeneity SPEC``).

* ``cpu=H:SPEED[:JITTER]``: emulated host ``H`` computes at ``SPEED`` (0 < SPEED <= 1) of
  its normal rate. Every ``period`` seconds (default 0.1) its processes (every pid in network
  namespace ``dlc-hH``) run for ``SPEED x period`` and are stopped (SIGSTOP, then SIGCONT)
  for the rest. With ``JITTER`` the speed of each period is drawn uniformly from
  ``SPEED +- JITTER``. Duty cycling slows a host *relative to the others* however loaded the
  machine is; a CPU quota (cgroup ``cpu.cfs_quota_us``) caps absolute CPU time, which does
  not bite when the machine is already oversubscribed (as ours is). It stops the engine
  thread too, so it slows host ``H``'s communication as much as its computation.
* ``compute=H:SPEED[:JITTER]``: only the computation of host ``H``'s ranks is slowed: not run
  here, but handed to the ranks in ``DLCOMM_EMULATE_COMPUTE`` (``rank_env``), where
  ``dlcomm.tools.emulation.compute_slowdown.ComputeSlowdown`` sleeps before each forward pass that
  the script wraps in it. SPEED in [0.05, 1]; ``*`` = every host, each with its own draws.
* ``congest=H:RATE[:ON_S[:OFF_S]]``: host ``H``'s link (both directions; ``*`` = every host,
  each with its own schedule) drops to ``RATE`` (tc units: ``100mbit``) for periods whose
  lengths are Pareto-distributed (shape 1.5, heavy-tailed) with mean ``ON_S`` (default 1 s),
  separated by exponential gaps of mean ``OFF_S`` (default 3 s).
* ``seed=N`` (default 0) fixes every draw; ``period=S`` sets the duty-cycle period.

Items are separated by commas: ``cpu=1:0.5,congest=*:100mbit:0.5:2,seed=3``,
``compute=1:0.5:0.1,seed=3``.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from dlcomm.tools.emulation.compute_slowdown import ENV_VAR as COMPUTE_ENV_VAR
from dlcomm.tools.emulation.compute_slowdown import (
    ComputeStraggler,
    format_compute_env,
    jittered_speeds,
)
from dlcomm.tools.emulation.plan import (
    BRIDGE_NAMESPACE,
    HOST_INTERFACE,
    bridge_port,
    host_namespace,
    parse_spec,
    tbf_command,
)

PARETO_SHAPE = 1.5


@dataclasses.dataclass(frozen=True)
class CpuSlowdown:
    """Host ``host`` runs at ``speed`` (+- ``jitter``) of its normal compute rate."""

    host: int
    speed: float
    jitter: float = 0.0


@dataclasses.dataclass(frozen=True)
class LinkCongestion:
    """Host ``host``'s link drops to ``rate_bits`` for heavy-tailed periods."""

    host: int
    rate_bits: int
    rate_text: str
    on_mean_s: float = 1.0
    off_mean_s: float = 3.0


@dataclasses.dataclass(frozen=True)
class HeterogeneitySpec:
    """A parsed ``--heterogeneity`` value."""

    cpu: tuple[CpuSlowdown, ...]
    congest: tuple[LinkCongestion, ...]
    seed: int = 0
    period_s: float = 0.1
    compute: tuple[ComputeStraggler, ...] = ()  # run by the ranks, not the controller


def _host(text: str, hosts: int | None, allow_all: bool) -> list[int]:
    if text == "*" and allow_all:
        if hosts is None:
            raise ValueError("'*' needs the number of hosts")
        return list(range(hosts))
    try:
        h = int(text)
    except ValueError:
        raise ValueError(f"bad host {text!r}: give an emulated host index like 1") from None
    if h < 0 or (hosts is not None and h >= hosts):
        raise ValueError(f"host {h} is outside the emulated cluster (0..{(hosts or 1) - 1})")
    return [h]


def parse_heterogeneity(text: str, hosts: int | None = None) -> HeterogeneitySpec:
    """Parse ``cpu=1:0.5,compute=2:0.5,congest=*:100mbit:1:3,seed=3,period=0.1`` (see the
    module doc); ValueError naming the item on anything else."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("--heterogeneity needs a spec such as 'cpu=1:0.5' or "
                         "'congest=*:100mbit,seed=1'")
    cpu: list[CpuSlowdown] = []
    congest: list[LinkCongestion] = []
    compute: list[ComputeStraggler] = []
    seed, period = 0, 0.1
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        parts = value.split(":")
        try:
            if key == "cpu" and eq and 2 <= len(parts) <= 3:
                speed = float(parts[1])
                jitter = float(parts[2]) if len(parts) == 3 else 0.0
                if not 0 < speed <= 1 or jitter < 0:
                    raise ValueError(f"cpu speed must be in (0, 1] and jitter >= 0: {item!r}")
                cpu += [CpuSlowdown(h, speed, jitter) for h in _host(parts[0], hosts, False)]
            elif key == "compute" and eq and 2 <= len(parts) <= 3:
                speed = float(parts[1])
                jitter = float(parts[2]) if len(parts) == 3 else 0.0
                for h in _host(parts[0], hosts, True):
                    if any(c.host == h for c in compute):
                        raise ValueError(f"host {h} has two compute= items")
                    compute.append(ComputeStraggler(h, speed, jitter))
            elif key == "congest" and eq and 2 <= len(parts) <= 4:
                rate = parse_spec(f"1x{parts[1]}")
                on = float(parts[2]) if len(parts) > 2 else 1.0
                off = float(parts[3]) if len(parts) > 3 else 3.0
                if on <= 0 or off <= 0:
                    raise ValueError(f"congestion ON_S and OFF_S must be > 0: {item!r}")
                congest += [LinkCongestion(h, rate.rate_bits, rate.rate_text, on, off)
                            for h in _host(parts[0], hosts, True)]
            elif key == "seed" and eq:
                seed = int(value)
            elif key == "period" and eq:
                period = float(value)
                if not 0.01 <= period <= 10:
                    raise ValueError(f"period must be in [0.01, 10] seconds: {item!r}")
            else:
                raise ValueError(f"unknown item {item!r}")
        except ValueError as exc:
            raise ValueError(f"bad --heterogeneity item {item!r}: {exc}; expected "
                             "cpu=H:SPEED[:JITTER], compute=H|*:SPEED[:JITTER], "
                             "congest=H|*:RATE[:ON_S[:OFF_S]], seed=N, period=S") from None
    return HeterogeneitySpec(tuple(cpu), tuple(congest), seed, period, tuple(compute))


def rank_env(spec: HeterogeneitySpec) -> dict[str, str]:
    """Environment the ranks need for ``spec``'s ``compute=`` items (empty without any);
    ``DLCOMM_*`` is forwarded to every rank by ``build_mpirun_command``."""
    if not spec.compute:
        return {}
    return {COMPUTE_ENV_VAR: format_compute_env(spec.compute, spec.seed)}


def iter_congestion(item: LinkCongestion, seed: int) -> Iterator[tuple[float, float]]:
    """Endless (start, duration) seconds of congested periods; a pure function of ``item``
    and ``seed``. Durations: Pareto (shape 1.5) with mean ``on_mean_s``; gaps: exponential
    with mean ``off_mean_s``."""
    rng = np.random.default_rng([seed, 1, item.host])
    scale = item.on_mean_s * (PARETO_SHAPE - 1) / PARETO_SHAPE  # Pareto mean = a*xm/(a-1)
    t = 0.0
    while True:
        t += float(rng.exponential(item.off_mean_s))
        duration = float(scale * (1.0 + rng.pareto(PARETO_SHAPE)))
        yield t, duration
        t += duration


def congestion_schedule(item: LinkCongestion, seed: int, horizon_s: float
                        ) -> list[tuple[float, float]]:
    """The periods of ``iter_congestion`` that start before ``horizon_s``."""
    out: list[tuple[float, float]] = []
    for start, duration in iter_congestion(item, seed):
        if start >= horizon_s:
            return out
        out.append((start, duration))
    return out


def cpu_speeds(item: CpuSlowdown, seed: int, periods: int) -> np.ndarray:
    """Speed of host ``item.host`` in each of ``periods`` duty periods (pure, seeded)."""
    rng = np.random.default_rng([seed, 2, item.host])
    return jittered_speeds(rng, item.speed, item.jitter, periods, 0.02)


def namespace_pids(namespace: str) -> list[int]:
    """Pids of the processes in network namespace ``namespace`` (not this process)."""
    proc = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                          check=False)
    me = os.getpid()
    return [int(p) for p in proc.stdout.split() if p.isdigit() and int(p) != me]


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class HeterogeneityController:
    """Runs the slowdowns and congestion of ``spec`` on an emulated cluster while active."""

    def __init__(self, spec: HeterogeneitySpec, base_rate_bits: int,
                 run: Any = None, pids: Any = None) -> None:
        if not isinstance(spec, HeterogeneitySpec):
            raise TypeError("spec must be a HeterogeneitySpec (use parse_heterogeneity)")
        self.spec = spec
        self.base_rate_bits = int(base_rate_bits)
        self._run = run or (lambda cmd: subprocess.run(cmd, check=False, capture_output=True))
        self._pids = pids or namespace_pids
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.events: list[tuple[float, str]] = []  # (seconds since start, what happened)
        self._t0 = 0.0

    def _log(self, what: str) -> None:
        self.events.append((time.monotonic() - self._t0, what))

    def _set_rate(self, host: int, rate_bits: int) -> None:
        self._run(tbf_command(host_namespace(host), HOST_INTERFACE, rate_bits))
        self._run(tbf_command(BRIDGE_NAMESPACE, bridge_port(host), rate_bits))

    def _congest(self, item: LinkCongestion) -> None:
        for start, duration in iter_congestion(item, self.spec.seed):
            if self._stop.wait(max(0.0, self._t0 + start - time.monotonic())):
                return
            self._set_rate(item.host, item.rate_bits)
            self._log(f"host {item.host} link -> {item.rate_text} for {duration:.2f}s")
            stopped = self._stop.wait(duration)
            self._set_rate(item.host, self.base_rate_bits)
            if stopped:
                return

    def _duty(self, item: CpuSlowdown) -> None:
        period = self.spec.period_s
        speeds = cpu_speeds(item, self.spec.seed, 1 << 18)
        ns = host_namespace(item.host)
        pids: list[int] = []
        refreshed = -1.0
        self._log(f"host {item.host} cpu at {item.speed:g} (+-{item.jitter:g})")
        for k in range(len(speeds)):
            now = time.monotonic()
            if now - refreshed > 1.0:
                pids, refreshed = self._pids(ns), now
            if speeds[k] >= 1.0 or not pids:
                if self._stop.wait(period):
                    return
                continue
            if self._stop.wait(speeds[k] * period):
                return
            _signal_all(pids, signal.SIGSTOP)
            try:
                self._stop.wait((1.0 - speeds[k]) * period)
            finally:
                _signal_all(pids, signal.SIGCONT)
            if self._stop.is_set():
                return

    def start(self) -> None:
        """Start one thread per slowed host and per congested link."""
        self._t0 = time.monotonic()
        for c in self.spec.compute:
            self._log(f"host {c.host} compute at {c.speed:g} (+-{c.jitter:g}) in the ranks "
                      f"({COMPUTE_ENV_VAR})")
        for item in self.spec.cpu:
            self._threads.append(threading.Thread(target=self._duty, args=(item,), daemon=True))
        for item in self.spec.congest:
            self._threads.append(threading.Thread(target=self._congest, args=(item,),
                                                  daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop every thread; stopped processes are continued and link rates restored."""
        self._stop.set()
        for t in self._threads:
            t.join(5.0)
        for item in self.spec.cpu:
            _signal_all(self._pids(host_namespace(item.host)), signal.SIGCONT)


@contextmanager
def heterogeneity(text: str | None, cluster: Any) -> Iterator[HeterogeneityController | None]:
    """Apply ``--heterogeneity`` ``text`` to an emulated ``cluster`` inside the block."""
    if not text:
        yield None
        return
    spec = parse_heterogeneity(text, cluster.spec.hosts)
    ctl = HeterogeneityController(spec, cluster.spec.rate_bits)
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
        print(f"dlcommrun: heterogeneity {text!r}: {len(ctl.events)} events", file=sys.stderr)
