"""What placing a layer's work on a rank costs: models by size, or times measured here.

``assignment_strategy`` (kfac-pytorch's name) picks the cost of inverting an n x n factor:
``compute`` is n^3 (KAISA's estimate of the second-order computation), ``memory`` is n^2
(what the rank must store), ``measured`` times the chosen method (inverse or eigen) on this
machine for each distinct size, so the placement sees where a large decomposition stops
scaling as n^3. Measured costs are taken on one rank and shared, so every rank places alike.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np

from dlcomm.kfac.curvature import NUMPY_LINALG, Linalg, damped_inverse, eigen_decomposition

STRATEGIES = ("compute", "memory", "measured")


def model_cost(strategy: str) -> Callable[[int], float]:
    """The cost of one factor of dimension n under a model strategy (compute or memory)."""
    if strategy == "compute":
        return lambda n: float(n) ** 3
    if strategy == "memory":
        return lambda n: float(n) ** 2
    raise ValueError(f"assignment_strategy {strategy!r} is not a model; use one of "
                     f"{', '.join(STRATEGIES)}")


def measure_inversion_seconds(sizes: Iterable[int], compute_method: str, *,
                              dtype: np.dtype = np.float32, repeats: int = 3,
                              seed: int = 0,
                              linalg: Linalg = NUMPY_LINALG) -> dict[int, float]:
    """Seconds to invert (``inverse``) or eigendecompose (``eigen``) a random SPD matrix of
    each size on this process with ``linalg``; the fastest of ``repeats`` runs."""
    if compute_method not in ("inverse", "eigen"):
        raise ValueError(f"compute_method must be 'inverse' or 'eigen', got {compute_method!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rng = np.random.default_rng(seed)
    out: dict[int, float] = {}
    for n in sorted(set(int(s) for s in sizes)):
        if n < 1:
            raise ValueError(f"factor sizes must be >= 1, got {n}")
        x = rng.standard_normal((n, 2 * n)).astype(dtype)
        spd = (x @ x.T) / (2 * n)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            if compute_method == "inverse":
                damped_inverse(spd, 1e-3, dtype, linalg)
            else:
                eigen_decomposition(spd, dtype, linalg)
            best = min(best, time.perf_counter() - start)
        out[n] = best
    return out


def preconditioning_flops(g_dim: int, a_dim: int, compute_method: str) -> float:
    """Floating-point operations of one layer's preconditioned gradient (per step): two
    products for ``G^-1 grad A^-1``, four for the eigenbasis form."""
    products = 2 if compute_method == "inverse" else 4
    return products * float(g_dim) * a_dim * (g_dim + a_dim)


def placement_work(dims: dict[str, tuple[int, int]], strategy: str, compute_method: str, *,
                   measured: dict[int, float] | None = None, inv_update_steps: int = 1,
                   preconditioning_on_owner: bool = False) -> dict[str, dict[str, float]]:
    """Layer -> {"A": cost, "G": cost} for ``place_inversions``; ``dims`` maps each layer to
    the dimensions of its (A, G) factors.

    With ``preconditioning_on_owner`` (MEM-OPT: the owner alone preconditions the layer every
    step) the layer's per-step preconditioning joins its G item, weighed against inversions
    that happen once every ``inv_update_steps`` steps.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"assignment_strategy {strategy!r} is not one of "
                         f"{', '.join(STRATEGIES)}")
    if strategy == "measured":
        if measured is None:
            raise ValueError("assignment_strategy='measured' needs the measured seconds")
        missing = sorted({n for a, g in dims.values() for n in (a, g)} - set(measured))
        if missing:
            raise ValueError(f"no measured inversion time for factor sizes {missing}")
        cost: Callable[[int], float] = lambda n: float(measured[n])  # noqa: E731
        largest = max(measured)
        unit = 2.0 * largest ** 3 / max(measured[largest], 1e-12)  # flops per second
    else:
        cost = model_cost(strategy)
        unit = 2.0  # n^3 stands for the ~2 n^3 flops of an inverse
    out: dict[str, dict[str, float]] = {}
    for name, (a_dim, g_dim) in dims.items():
        work = {"A": cost(a_dim), "G": cost(g_dim)}
        if preconditioning_on_owner and strategy != "memory":
            per_step = preconditioning_flops(g_dim, a_dim, compute_method) / unit
            work["G"] += per_step * inv_update_steps
        out[name] = work
    return out
