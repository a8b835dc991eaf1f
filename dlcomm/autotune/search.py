"""Bayesian optimisation of (fusion threshold, cycle time) against a measured cost.

A thin ask/tell wrapper over optuna's ``GPSampler`` (a Gaussian-process surrogate with an
expected-improvement acquisition, the method of Horovod's autotuner), seeded so a run is
reproducible. Only the rank that decides (rank 0) imports optuna.
"""
from __future__ import annotations

import math
from typing import Any

MIB = 1 << 20


class BayesianSearch:
    """Minimise a noisy cost over ``fusion_threshold`` (bytes) and ``cycle_time`` (ms).

    ``ask()`` returns the next ``(fusion_threshold, cycle_time)`` to try; ``tell(cost)``
    records what it cost (lower is better, e.g. seconds per iteration). The first point
    asked is ``initial`` (the settings the job started with).
    """

    def __init__(self, *, fusion_mib: tuple[float, float] = (0.0, 128.0),
                 cycle_ms: tuple[float, float] = (0.2, 20.0),
                 initial: tuple[int, float] | None = None, seed: int = 0,
                 startup_trials: int = 4) -> None:
        for name, (lo, hi) in (("fusion_mib", fusion_mib), ("cycle_ms", cycle_ms)):
            if not (0 <= lo < hi and math.isfinite(hi)):
                raise ValueError(f"{name} must be (low, high) with 0 <= low < high, got "
                                 f"{(lo, hi)}")
        if startup_trials < 1:
            raise ValueError(f"startup_trials must be >= 1, got {startup_trials}")
        # Optional dependency, pinned in the 'autotune' extra: optuna>=4,<6 (GPSampler).
        import optuna  # noqa: PLC0415

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._dists = {
            "fusion_mib": optuna.distributions.FloatDistribution(*fusion_mib),
            "cycle_ms": optuna.distributions.FloatDistribution(*cycle_ms),
        }
        sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials)
        self._study = optuna.create_study(direction="minimize", sampler=sampler)
        if initial is not None:
            fusion, cycle = initial
            self._study.enqueue_trial({
                "fusion_mib": min(max(fusion / MIB, fusion_mib[0]), fusion_mib[1]),
                "cycle_ms": min(max(cycle, cycle_ms[0]), cycle_ms[1])})
        self._trial: Any = None

    def ask(self) -> tuple[int, float]:
        """The next settings to measure: ``(fusion_threshold bytes, cycle_time ms)``."""
        if self._trial is not None:
            raise RuntimeError("tell() the cost of the previous ask() first")
        self._trial = self._study.ask(self._dists)
        return _decode(self._trial.params)

    def tell(self, cost: float) -> None:
        """Record the cost of the settings of the last ``ask()``."""
        if self._trial is None:
            raise RuntimeError("ask() before tell()")
        if not math.isfinite(cost):
            raise ValueError(f"cost must be finite, got {cost}")
        self._study.tell(self._trial, float(cost))
        self._trial = None

    def best(self) -> tuple[tuple[int, float], float]:
        """``((fusion_threshold, cycle_time), cost)`` of the cheapest settings measured."""
        trial = self._study.best_trial
        return _decode(trial.params), float(trial.value)


def _decode(params: dict) -> tuple[int, float]:
    return int(round(params["fusion_mib"] * MIB)), float(params["cycle_ms"])
