"""Online autotuning of the engine's fusion threshold and cycle time.

Like Horovod's parameter manager: skip a few warm-up steps, then time ``steps_per_sample``
optimizer steps under each candidate setting, score it by the median step time averaged over
ranks, and let a Bayesian search on rank 0 pick the next candidate, which rank 0 broadcasts.
Every rank applies it at the same step. After ``max_samples`` candidates the best one is
applied for good. Rank 0 appends one JSON line per sample to the log file.
"""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dlcomm import mpi_ops
from dlcomm.autotune.search import BayesianSearch
from dlcomm.functions import broadcast_object

Settings = tuple[int, float]  # (fusion_threshold bytes, cycle_time ms)


class Autotuner:
    """Drives the search from ``step_finished()`` calls, one per optimizer step on every rank.

    ``apply(fusion_threshold, cycle_time)`` changes the settings; ``initial`` is what the job
    runs with now. ``mean_over_ranks(x)`` and ``broadcast(obj)`` (from rank 0) agree across
    ranks; the defaults use dlcomm's running engine, tests pass their own. ``search`` is
    built on rank 0 only (``make_search(initial)``, default a ``BayesianSearch``).
    """

    def __init__(self, apply: Callable[[int, float], None], initial: Settings, *,
                 rank: int = 0, warmup_steps: int = 3, steps_per_sample: int = 10,
                 max_samples: int = 20, log_path: str = "",
                 mean_over_ranks: Callable[[float], float] | None = None,
                 broadcast: Callable[[Any], Any] | None = None,
                 make_search: Callable[[Settings], Any] | None = None) -> None:
        for name, value, low in (("warmup_steps", warmup_steps, 0),
                                 ("steps_per_sample", steps_per_sample, 1),
                                 ("max_samples", max_samples, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not callable(apply):
            raise TypeError("apply must be callable(fusion_threshold, cycle_time)")
        self._apply = apply
        self._rank = rank
        self._warmup = warmup_steps
        self._steps_per_sample = steps_per_sample
        self._max_samples = max_samples
        self._log_path = log_path
        self._mean = mean_over_ranks or _dlcomm_mean
        self._broadcast = broadcast or _dlcomm_broadcast
        self._search = None
        if rank == 0:
            self._search = (make_search or _default_search)(initial)
        self.current: Settings = initial
        self.samples: list[tuple[Settings, float]] = []  # agreed (settings, cost), in order
        self.done = False
        self._last: float | None = None
        self._steps = 0
        self._durations: list[float] = []
        self._started = False

    def step_finished(self, elapsed: float | None = None) -> None:
        """One optimizer step ended; ``elapsed`` overrides the time since the previous call."""
        now = time.perf_counter()
        if elapsed is None:
            elapsed = None if self._last is None else now - self._last
        self._last = now
        if self.done:
            return
        self._steps += 1
        if self._steps <= self._warmup or elapsed is None:
            return
        if not self._started:  # first measured sample: the settings rank 0's search asks
            self._started = True
            self._next_candidate()
            self._durations.clear()
            return
        self._durations.append(float(elapsed))
        if len(self._durations) < self._steps_per_sample:
            return
        cost = self._mean(statistics.median(self._durations))
        self._durations.clear()
        self.samples.append((self.current, cost))
        if self._search is not None:
            self._search.tell(cost)
        self._log({"sample": len(self.samples), "fusion_threshold": self.current[0],
                   "cycle_time_ms": self.current[1], "seconds_per_step": cost})
        if len(self.samples) >= self._max_samples:
            best = self._broadcast(self._search.best()[0] if self._search is not None else None)
            self._set(tuple(best))
            self.done = True
            self._log({"final": True, "fusion_threshold": self.current[0],
                       "cycle_time_ms": self.current[1]})
            return
        self._next_candidate()

    def _next_candidate(self) -> None:
        proposal = self._search.ask() if self._search is not None else None
        self._set(tuple(self._broadcast(proposal)))
        self._last = time.perf_counter()  # the agreement itself is not part of a step

    def _set(self, settings: tuple) -> None:
        fusion, cycle = int(settings[0]), float(settings[1])
        self._apply(fusion, cycle)
        self.current = (fusion, cycle)

    def _log(self, record: dict) -> None:
        if self._rank == 0 and self._log_path:
            with open(self._log_path, "a") as f:
                f.write(json.dumps(record) + "\n")


def _default_search(initial: Settings) -> Any:
    return BayesianSearch(initial=initial)


def _dlcomm_mean(value: float) -> float:
    return float(mpi_ops.allreduce(np.array([value], dtype=np.float64),
                                   name="autotune.cost")[0])


def _dlcomm_broadcast(obj: Any) -> Any:
    return broadcast_object(obj, root_rank=0, name="autotune.settings")
