"""Heterogeneity over time: how fast each worker computes at each iteration (a straggler
trace, for LB-BSP) and how fast each host's link is at each moment (a congestion trace, for
DLCP).

Both can be built from the same ``--heterogeneity`` text the emulated cluster takes
(``compute=1:0.5,seed=1``, ``congest=*:100mbit:1:3,seed=1``), with the emulator's own seeded
draws (``dlcomm.launcher``), so a simulated run sees the schedule the emulated one saw; or
generated for clusters the emulator cannot hold (``markov_stragglers``); or read from JSON.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import json
import math
from pathlib import Path

import numpy as np

from dlcomm.tools.simulate.network import parse_rate


@dataclasses.dataclass(frozen=True)
class StragglerTrace:
    """``speeds[t][i]``: worker i's compute speed at iteration t (1 = nominal, 0.5 = takes
    twice as long). Iterations past the end repeat the last row."""

    speeds: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        rows = tuple(tuple(float(s) for s in row) for row in self.speeds)
        if not rows or not rows[0]:
            raise ValueError("a straggler trace needs at least one iteration and one worker")
        if any(len(r) != len(rows[0]) for r in rows):
            raise ValueError("every iteration of a straggler trace must list every worker")
        if any(not math.isfinite(s) or not 0 < s <= 1e6 for r in rows for s in r):
            raise ValueError("straggler speeds must be finite and > 0")
        object.__setattr__(self, "speeds", rows)

    @property
    def workers(self) -> int:
        """Workers in the trace."""
        return len(self.speeds[0])

    def at(self, iteration: int) -> tuple[float, ...]:
        """Every worker's speed at ``iteration``."""
        return self.speeds[min(iteration, len(self.speeds) - 1)]

    @classmethod
    def uniform(cls, workers: int) -> StragglerTrace:
        """Every worker at full speed."""
        return cls(((1.0,) * workers,))

    @classmethod
    def constant(cls, workers: int, slow: dict[int, float]) -> StragglerTrace:
        """Worker i at ``slow[i]`` throughout, the others at 1."""
        for i in slow:
            if not 0 <= i < workers:
                raise ValueError(f"straggler {i} is outside 0..{workers - 1}")
        return cls((tuple(slow.get(i, 1.0) for i in range(workers)),))

    @classmethod
    def from_heterogeneity(cls, text: str, hosts: int, slots_per_host: int, iterations: int
                           ) -> StragglerTrace:
        """The ``compute=H:SPEED[:JITTER]`` items of a ``--heterogeneity`` spec: every rank of
        host H at the speeds the emulator draws for it (one per compute block)."""
        from dlcomm.tools.emulation.compute_slowdown import compute_speeds
        from dlcomm.tools.emulation.heterogeneity import parse_heterogeneity

        spec = parse_heterogeneity(text, hosts)
        if not spec.compute:
            raise ValueError(f"{text!r} has no compute= item to build a straggler trace from")
        per_host = np.ones((iterations, hosts))
        for item in spec.compute:
            per_host[:, item.host] = compute_speeds(item, spec.seed, iterations)
        return cls(tuple(tuple(np.repeat(row, slots_per_host)) for row in per_host))

    @classmethod
    def markov_stragglers(cls, workers: int, iterations: int, *, slow_fraction: float = 0.25,
                          slow_speed: float = 0.5, mean_dwell: float = 20.0, seed: int = 0
                          ) -> StragglerTrace:
        """A non-dedicated cluster: each worker switches between full speed and
        ``slow_speed`` (another job arrived on its machine) after geometrically distributed
        stays of mean ``mean_dwell`` iterations, slow ``slow_fraction`` of the time."""
        if not 0 <= slow_fraction < 1 or not 0 < slow_speed <= 1 or mean_dwell < 1:
            raise ValueError("need 0 <= slow_fraction < 1, 0 < slow_speed <= 1, mean_dwell >= 1")
        rng = np.random.default_rng([seed, 26])
        leave_slow = 1.0 / mean_dwell
        enter_slow = leave_slow * slow_fraction / (1 - slow_fraction) if slow_fraction else 0.0
        slow = rng.random(workers) < slow_fraction
        rows = []
        for _ in range(iterations):
            rows.append(tuple(np.where(slow, slow_speed, 1.0)))
            flip = rng.random(workers)
            slow = np.where(slow, flip >= leave_slow, flip < enter_slow)
        return cls(tuple(rows))

    def to_dict(self) -> dict[str, object]:
        """JSON form: ``{"speeds": [[...], ...]}``."""
        return {"speeds": [list(r) for r in self.speeds]}

    @classmethod
    def load(cls, path: str | Path) -> StragglerTrace:
        """Read ``{"speeds": [[worker speeds of iteration 0], ...]}``."""
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or "speeds" not in data:
            raise ValueError(f"{path}: expected a JSON object with a 'speeds' list of lists")
        return cls(tuple(tuple(r) for r in data["speeds"]))


@dataclasses.dataclass(frozen=True)
class CongestionTrace:
    """Each host's link runs at ``base_rate`` bit/s except during its congested periods
    (start, duration in seconds, rate; sorted by start), when it runs at that period's
    rate."""

    hosts: int
    base_rate: float
    periods: tuple[tuple[tuple[float, float, float], ...], ...]  # per host: start, dur, rate

    @functools.cached_property
    def _index(self) -> tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]:
        """Per host: the periods' starts, and the latest end of any period up to each."""
        out = []
        for host in self.periods:
            ends = list(itertools.accumulate((s + d for s, d, _ in host), max))
            out.append((tuple(s for s, _, _ in host), tuple(ends)))
        return tuple(out)

    def _overlapping(self, host: int, t0: float, t1: float) -> list[tuple[float, float, float]]:
        """(start, end, rate) of host ``host``'s periods that overlap ``[t0, t1]``."""
        starts, latest_end = self._index[host]
        out = []
        i = bisect.bisect_right(starts, t1)
        while i > 0 and latest_end[i - 1] > t0:
            i -= 1
            start, duration, rate = self.periods[host][i]
            if start + duration > t0:
                out.append((start, start + duration, rate))
        return out

    def rate(self, host: int, t: float) -> float:
        """Host ``host``'s link rate in bit/s at time ``t`` (the lowest of its periods there,
        should two overlap)."""
        return self._rate_in(self._overlapping(host, t, t), t)

    def _rate_in(self, spans: list[tuple[float, float, float]], t: float) -> float:
        covering = [rate for start, end, rate in spans if start <= t < end]
        return min(covering) if covering else self.base_rate

    def rates(self, t: float) -> list[float]:
        """Every host's rate at ``t``."""
        return [self.rate(h, t) for h in range(self.hosts)]

    def mean_slowest_rate(self, t0: float, t1: float) -> float:
        """The slowest host's rate averaged over ``[t0, t1]`` (bits a ring moves per second
        there: it runs at its slowest edge's rate); the rate at ``t0`` when ``t1 <= t0``."""
        if t1 <= t0:
            return min(self.rates(t0))
        spans = [self._overlapping(h, t0, t1) for h in range(self.hosts)]
        edges = sorted({t0, t1} | {e for host in spans for s, end, _ in host
                                   for e in (s, end) if t0 < e < t1})
        bits = 0.0
        for a, b in zip(edges, edges[1:]):
            mid = (a + b) / 2
            bits += (b - a) * min(self._rate_in(host, mid) for host in spans)
        return bits / (t1 - t0)

    @classmethod
    def steady(cls, hosts: int, base_rate: str | float) -> CongestionTrace:
        """No congestion."""
        return cls(hosts, parse_rate(base_rate), tuple(() for _ in range(hosts)))

    @classmethod
    def from_heterogeneity(cls, text: str, hosts: int, base_rate: str | float,
                           horizon_s: float) -> CongestionTrace:
        """The ``congest=H|*:RATE[:ON_S[:OFF_S]]`` items of a ``--heterogeneity`` spec, drawn
        as the emulator draws them (heavy-tailed periods, same seed), up to ``horizon_s``."""
        from dlcomm.tools.emulation.heterogeneity import congestion_schedule, parse_heterogeneity

        spec = parse_heterogeneity(text, hosts)
        if not spec.congest:
            raise ValueError(f"{text!r} has no congest= item to build a congestion trace from")
        periods: list[list[tuple[float, float, float]]] = [[] for _ in range(hosts)]
        for item in spec.congest:
            periods[item.host] += [(s, d, float(item.rate_bits))
                                   for s, d in congestion_schedule(item, spec.seed, horizon_s)]
        return cls(hosts, parse_rate(base_rate),
                   tuple(tuple(sorted(p)) for p in periods))

