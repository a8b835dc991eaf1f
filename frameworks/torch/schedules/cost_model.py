"""The alpha-beta model of an all-reduce, ``time(bytes) = alpha + beta * bytes``, fitted by
least squares on all-reduces timed at start-up, and agreed from rank 0.

MG-WFBP decides which layers to merge with it: merging two messages saves one ``alpha``
and costs waiting for the later gradient.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence

import numpy as np
import torch

from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.torch import mpi_ops
from dlcomm.torch.functions import broadcast_object

DEFAULT_PROBE_BYTES = (4 << 10, 64 << 10, 512 << 10, 2 << 20)


@dataclasses.dataclass(frozen=True)
class AlphaBeta:
    """Start-up time ``alpha`` (seconds) and time per byte ``beta`` (seconds/byte)."""

    alpha: float
    beta: float

    def time(self, nbytes: float) -> float:
        """Predicted all-reduce time of a message of ``nbytes`` bytes."""
        return self.alpha + self.beta * nbytes


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float]) -> AlphaBeta:
    """Least-squares fit of ``times = alpha + beta * sizes``; both clipped at 0.

    Needs at least two distinct sizes. A negative intercept (noise) becomes 0, and so does a
    negative slope, so the model never predicts negative times.
    """
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(times, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"sizes and times must be 1-D and of equal length, got shapes "
                         f"{x.shape} and {y.shape}")
    if len(np.unique(x)) < 2:
        raise ValueError("fit_alpha_beta needs at least two distinct sizes")
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or (x < 0).any() or (y < 0).any():
        raise ValueError("sizes and times must be finite and >= 0")
    design = np.stack([np.ones_like(x), x], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, y, rcond=None)
    beta = max(float(beta), 0.0)
    if alpha < 0:  # refit the slope through the origin
        alpha, beta = 0.0, max(float(x @ y / (x @ x)), 0.0)
    return AlphaBeta(float(alpha), beta)


def measure_allreduce_times(probe_bytes: Sequence[int] = DEFAULT_PROBE_BYTES, repeats: int = 3,
                            process_set: ProcessSet = global_process_set,
                            name: str = "costmodel") -> list[float]:
    """Median seconds of a dlcomm all-reduce (engine included) of each float32 size.

    Collective: every rank of ``process_set`` must call it with the same arguments.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out = []
    for nbytes in probe_bytes:
        if nbytes < 4:
            raise ValueError(f"probe sizes must be >= 4 bytes, got {nbytes}")
        buf = torch.zeros(nbytes // 4)
        mpi_ops.allreduce_(buf, name=f"{name}.warm.{nbytes}", process_set=process_set)
        samples = []
        for r in range(repeats):
            t0 = time.perf_counter()
            mpi_ops.allreduce_(buf, name=f"{name}.{nbytes}.{r}", process_set=process_set)
            samples.append(time.perf_counter() - t0)
        out.append(statistics.median(samples))
    return out


def agreed_alpha_beta(probe_bytes: Sequence[int] = DEFAULT_PROBE_BYTES, repeats: int = 3,
                      process_set: ProcessSet = global_process_set,
                      name: str = "costmodel") -> AlphaBeta:
    """Time all-reduces, fit on rank 0, broadcast: every rank gets the same model."""
    times = measure_allreduce_times(probe_bytes, repeats, process_set, name)
    model = fit_alpha_beta(probe_bytes, times)
    return broadcast_object(model, root_rank=0, name=f"{name}.fit", process_set=process_set)
