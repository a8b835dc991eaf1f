"""Predict how long each client's local training will take, from what earlier rounds measured.

Parrot schedules by predicted cost. Here a client's cost is kept in "seconds on a rank of
average speed": a client seen before is predicted by its own smoothed history; a new one by a
line (fixed cost plus a cost per sample) fitted to every observation so far, and before any
observation by its sample count. Each rank's relative speed is learned the same way, so a
slower rank (or device) gets less work. Observations come from the round's all-reduce, so
every rank holds the same model and derives the same schedule.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class CostModel:
    """Per-client costs and per-rank speeds, smoothed with weight ``smoothing`` on the new."""

    def __init__(self, client_sizes: Sequence[int], num_ranks: int,
                 smoothing: float = 0.5) -> None:
        sizes = np.asarray(client_sizes, dtype=np.float64)
        if sizes.ndim != 1 or sizes.size == 0 or np.any(sizes < 0):
            raise ValueError("client_sizes must be a non-empty sequence of sample counts >= 0")
        if not isinstance(num_ranks, int) or num_ranks < 1:
            raise ValueError(f"num_ranks must be an int >= 1, got {num_ranks!r}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must lie in (0, 1], got {smoothing!r}")
        self.sizes = sizes
        self.smoothing = float(smoothing)
        self.client_cost = np.full(sizes.size, np.nan)
        self.rank_speed = np.ones(num_ranks)
        self._fit = np.zeros(5)  # decayed sums: n, x, y, xx, xy (x: samples, y: cost)
        self._observed = False

    def line(self) -> tuple[float, float]:
        """(fixed cost, cost per sample) of a client never seen; (0, 1) before any data."""
        n, x, y, xx, xy = self._fit
        if not self._observed or n <= 0:
            return 0.0, 1.0
        var = xx / n - (x / n) ** 2
        if n < 2 or var <= 1e-12 * max(1.0, (x / n) ** 2):  # one size seen: no slope
            return (0.0, float(y / x)) if x > 0 else (float(y / n), 0.0)
        slope = (xy / n - (x / n) * (y / n)) / var
        intercept = y / n - slope * x / n
        if slope < 0 or intercept < 0:  # a noisy fit must not predict negative costs
            slope = max(slope, 0.0)
            intercept = max(y / n - slope * x / n, 0.0)
        return float(intercept), float(slope)

    def predict(self, clients: Sequence[int]) -> np.ndarray:
        """Predicted cost of each client on a rank of speed 1."""
        c = np.asarray(clients, dtype=np.int64)
        a, b = self.line()
        out = a + b * self.sizes[c]
        known = ~np.isnan(self.client_cost[c])
        out[known] = self.client_cost[c][known]
        return np.maximum(out, 1e-9)

    def observe(self, clients: Sequence[int], ranks: Sequence[int],
                seconds: Sequence[float]) -> None:
        """Learn from a round: client ``clients[i]`` took ``seconds[i]`` on rank ``ranks[i]``."""
        c = np.asarray(clients, dtype=np.int64)
        r = np.asarray(ranks, dtype=np.int64)
        t = np.asarray(seconds, dtype=np.float64)
        if not (c.shape == r.shape == t.shape) or np.any(t < 0):
            raise ValueError("clients, ranks and seconds must be equal-length, seconds >= 0")
        if c.size == 0:
            return
        predicted = self.predict(c)
        busy = np.bincount(r, weights=t, minlength=self.rank_speed.size)
        work = np.bincount(r, weights=predicted, minlength=self.rank_speed.size)
        seen = busy > 0
        if seen.any():
            raw = np.where(seen, work / np.where(seen, busy, 1.0), 0.0)
            rel = raw / raw[seen].mean() * self.rank_speed[seen].mean()
            a = self.smoothing
            self.rank_speed[seen] = (1 - a) * self.rank_speed[seen] + a * rel[seen]
        cost = t * self.rank_speed[r]
        old = self.client_cost[c]
        self.client_cost[c] = np.where(np.isnan(old), cost,
                                       (1 - self.smoothing) * old + self.smoothing * cost)
        x = self.sizes[c]
        self._fit *= 1 - self.smoothing / 2
        self._fit += [c.size, x.sum(), cost.sum(), (x * x).sum(), (x * cost).sum()]
        self._observed = True
