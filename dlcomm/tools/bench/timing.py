"""Timing one operation on every rank the way nccl-tests and Horovod's benchmark do.

Each iteration starts after a barrier, so all ranks begin together; an iteration's time is
the slowest rank's (a collective is done when its last rank is done), and the figure
reported is the median over iterations, which a noisy shared machine disturbs least.
Peers are timed interleaved (``time_interleaved``) or in alternating blocks
(``time_in_blocks``, which can start and stop dlcomm's engine between blocks).
"""
from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def check_counts(warmup: int, iters: int) -> None:
    """Validate warm-up and iteration counts (``-w`` and ``-n``)."""
    for name, value in (("warm-up count (-w)", warmup), ("iteration count (-n)", iters)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if warmup < 0:
        raise ValueError(f"warm-up count (-w) must be >= 0, got {warmup}")
    if iters < 1:
        raise ValueError(f"iteration count (-n) must be >= 1, got {iters}")


def time_interleaved(ops: Sequence[Callable[[], Any]], comm: Any, warmup: int, iters: int,
                     before: Callable[[], Any] | None = None) -> np.ndarray:
    """Time several operations in turn, each iteration running every op once.

    Returns an array of shape ``(len(ops), iters)``: for each op and iteration, the slowest
    rank's time in seconds. Interleaving puts the peers under the same load at the same
    moment, which matters on a shared machine. ``comm`` is an mpi4py communicator of the
    ranks taking part, used for the barrier before each timed call and for one
    max-reduction of all times at the end (nothing else is sent between iterations).
    ``before``, if given, runs before each barrier, untimed.
    """
    check_counts(warmup, iters)
    ops = list(ops)
    if not ops or not all(callable(op) for op in ops):
        raise TypeError("ops must be a non-empty list of callables")
    local = np.empty((len(ops), iters), dtype=np.float64)
    for i in range(warmup + iters):
        for k, op in enumerate(ops):
            if before is not None:
                before()
            comm.Barrier()
            start = time.perf_counter()
            op()
            elapsed = time.perf_counter() - start
            if i >= warmup:
                local[k, i - warmup] = elapsed
    slowest = np.empty_like(local)
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    comm.Allreduce(local, slowest, op=MPI.MAX)
    return slowest


def time_in_blocks(ops: Sequence[Callable[[], Any]], comm: Any, warmup: int, iters: int,
                   block: int = 5, enter: Sequence[Callable[[], Any] | None] | None = None
                   ) -> np.ndarray:
    """Time several operations in alternating blocks: ``block`` iterations of op 0, then of
    op 1, ..., repeated until each op has ``iters`` timed iterations.

    ``enter[k]``, if given, runs (untimed) before each block of op ``k``, followed by
    ``warmup`` untimed iterations: it is how a benchmark starts dlcomm's engine for dlcomm's
    blocks and stops it for the raw peer's, so the raw peer never shares the process with an
    idle engine thread. Blocks keep the peers close in time on a machine whose load drifts.
    Returns ``(len(ops), iters)`` slowest-rank times in seconds, as ``time_interleaved``.
    """
    check_counts(warmup, iters)
    ops = list(ops)
    if not ops or not all(callable(op) for op in ops):
        raise TypeError("ops must be a non-empty list of callables")
    if isinstance(block, bool) or not isinstance(block, numbers.Integral) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    enter = list(enter) if enter is not None else [None] * len(ops)
    if len(enter) != len(ops):
        raise ValueError(f"got {len(enter)} enter callbacks for {len(ops)} ops")
    local = np.empty((len(ops), iters), dtype=np.float64)
    done = 0
    while done < iters:
        count = min(block, iters - done)
        for k, op in enumerate(ops):
            if enter[k] is not None:
                enter[k]()
            for i in range(warmup + count):
                comm.Barrier()
                start = time.perf_counter()
                op()
                elapsed = time.perf_counter() - start
                if i >= warmup:
                    local[k, done + i - warmup] = elapsed
        done += count
    slowest = np.empty_like(local)
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    comm.Allreduce(local, slowest, op=MPI.MAX)
    return slowest


def time_iterations(op: Callable[[], Any], comm: Any, warmup: int, iters: int,
                    before: Callable[[], Any] | None = None) -> np.ndarray:
    """``time_interleaved`` for one op: its ``iters`` slowest-rank times in seconds."""
    if not callable(op):
        raise TypeError(f"op must be callable, got {type(op).__name__}")
    return time_interleaved([op], comm, warmup, iters, before)[0]


def summarize_times(times: np.ndarray) -> dict[str, float]:
    """Median, min and max of per-iteration times, in seconds."""
    arr = np.asarray(times, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("times must be a non-empty 1-D array of seconds")
    return {"median_s": float(np.median(arr)), "min_s": float(arr.min()),
            "max_s": float(arr.max()), "iters": int(arr.size)}
