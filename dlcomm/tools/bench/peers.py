"""The operations a collective benchmark compares, on the same buffers, with their reference.

For one collective, size and dtype, ``make_case`` builds each rank's input, the numpy
reference of the result, and two callables: dlcomm's collective and the raw mpi4py call
that does the same work (``comm.Allreduce`` and friends), which is the peer every dlcomm
figure is a ratio against. Inputs are small integers, so sums are exact in every dtype and
the check can compare exactly (to float tolerance for averages and float16).
"""
from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import dlcomm
from dlcomm.tools.bench.units import COLLECTIVES

OPS = ("sum", "average", "min", "max", "product")
REDUCING = ("allreduce", "reducescatter")
DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")
_SENTINEL = 123


@dataclass
class Case:
    """One collective at one size on this rank: buffers, reference and both peers."""

    collective: str
    nbytes: int  # the size nccl-tests reports for this collective (see ``element_count``)
    count: int  # elements in ``nbytes``
    dtype: np.dtype
    expected: np.ndarray  # this rank's correct result
    run_dlcomm: Callable[[], np.ndarray]
    run_raw: Callable[[], np.ndarray] | None  # None: mpi4py cannot do this (e.g. float16)
    raw_unavailable: str = ""  # why run_raw is None
    reset: Callable[[], None] = lambda: None  # clear outputs before a correctness check


def check_op_dtype(collective: str, op: str, dtype: Any) -> np.dtype:
    """Validate the collective, ``--op`` and ``-d``; return the numpy dtype."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}") from None
    if dt.name not in DTYPES:
        raise ValueError(f"dtype {dt.name} is not benchmarked; known: {', '.join(DTYPES)}")
    if op == "average" and dt.kind != "f":
        raise ValueError(f"op 'average' needs a float dtype, got {dt.name}")
    if op != "sum" and collective not in REDUCING:
        raise ValueError(f"--op applies to allreduce and reducescatter only, not {collective}")
    return dt


def element_count(collective: str, nbytes: int, itemsize: int, ranks: int) -> int:
    """Elements of the reported size: whole elements, a multiple of ``ranks`` where the
    collective splits the buffer among ranks (all-gather's output, reduce-scatter's input,
    all-to-all's send buffer), and at least one per rank there."""
    count = max(1, nbytes // itemsize)
    if collective in ("allgather", "reducescatter", "alltoall"):
        count = max(ranks, count - count % ranks)
    return count


def rank_input(count: int, dtype: np.dtype, rank: int) -> np.ndarray:
    """Rank ``rank``'s input: ``(i mod 4) + (rank mod 3)``, small enough to sum exactly."""
    return ((np.arange(count) % 4) + (rank % 3)).astype(dtype)


def reduce_reference(count: int, dtype: np.dtype, op: str, ranks: int) -> np.ndarray:
    """The reduction of every rank's ``rank_input`` with ``op``, computed with numpy."""
    ufunc = {"sum": np.add, "average": np.add, "min": np.minimum, "max": np.maximum,
             "product": np.multiply}[op]
    acc = rank_input(count, dtype, 0)
    for r in range(1, ranks):
        acc = ufunc(acc, rank_input(count, dtype, r))
    if op == "average":
        acc = (acc / ranks).astype(dtype)
    return acc


def results_match(result: Any, expected: np.ndarray) -> bool:
    """True when ``result`` equals ``expected`` (exactly for ints, to tolerance for floats)."""
    result = np.asarray(result)
    if result.shape != expected.shape or result.dtype != expected.dtype:
        return False
    if expected.dtype.kind != "f":
        return bool(np.array_equal(result, expected))
    rtol = 1e-3 if expected.dtype.itemsize <= 2 else 1e-6
    return bool(np.allclose(result, expected, rtol=rtol, atol=0.0, equal_nan=True))


def _mpi_op(op: str) -> Any:
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    return {"sum": MPI.SUM, "average": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX,
            "product": MPI.PROD}[op]


def _dlcomm_op(op: str) -> Any:
    return {"sum": dlcomm.Sum, "average": dlcomm.Average, "min": dlcomm.Min,
            "max": dlcomm.Max, "product": dlcomm.Product}[op]


def _raw_support(dtype: np.dtype) -> str:
    """Empty when mpi4py has an MPI datatype for ``dtype``, else the reason it has none."""
    # MPI start-up: importing mpi4py.MPI initialises MPI.
    from mpi4py.util import dtlib

    try:
        dtlib.from_numpy_dtype(dtype)
    except Exception:  # noqa: BLE001 - any failure means the MPI library lacks the type
        return f"the MPI library has no {dtype.name} type"
    return ""


def make_case(collective: str, nbytes: int, dtype: Any, op: str, comm: Any, *,
              root: int = 0, name: str | None = None) -> Case:
    """Build the buffers, reference and both peers for one size on this rank.

    ``comm`` is the mpi4py communicator the raw peer uses (the benchmark's own duplicate of
    the world, so raw traffic never mixes with dlcomm's). ``root`` is broadcast's root.
    """
    dt = check_op_dtype(collective, op, dtype)
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 1:
        raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
    rank, n = comm.Get_rank(), comm.Get_size()
    if isinstance(root, bool) or not isinstance(root, numbers.Integral) or not 0 <= root < n:
        raise ValueError(f"root must be a rank in [0, {n}), got {root!r}")

    count = element_count(collective, nbytes, dt.itemsize, n)
    name = name or f"bench.{collective}.{count * dt.itemsize}"
    unavailable = _raw_support(dt)
    dop = _dlcomm_op(op)
    mop = _mpi_op(op)
    raw: Callable[[], np.ndarray] | None = None
    buffers: list[np.ndarray] = []

    if collective == "allreduce":
        send = rank_input(count, dt, rank)
        expected = reduce_reference(count, dt, op, n)
        out, raw_out = np.empty_like(send), np.empty_like(send)
        buffers = [out, raw_out]

        def run() -> np.ndarray:
            return dlcomm.allreduce(send, name=name, op=dop, output=out)

        def raw() -> np.ndarray:
            comm.Allreduce(send, raw_out, op=mop)
            if op == "average":
                np.divide(raw_out, n, out=raw_out)
            return raw_out

    elif collective == "reducescatter":
        send = rank_input(count, dt, rank)
        part = count // n
        expected = reduce_reference(count, dt, op, n)[rank * part:(rank + 1) * part]
        raw_out = np.empty(part, dtype=dt)
        buffers = [raw_out]

        def run() -> np.ndarray:
            return dlcomm.reducescatter(send, name=name, op=dop)

        def raw() -> np.ndarray:
            comm.Reduce_scatter_block(send, raw_out, op=mop)
            if op == "average":
                np.divide(raw_out, n, out=raw_out)
            return raw_out

    elif collective == "allgather":
        part = count // n
        send = rank_input(part, dt, rank)
        expected = np.concatenate([rank_input(part, dt, r) for r in range(n)])
        raw_out = np.empty(count, dtype=dt)
        buffers = [raw_out]

        def run() -> np.ndarray:
            return dlcomm.allgather(send, name=name)

        def raw() -> np.ndarray:
            comm.Allgather(send, raw_out)
            return raw_out

    elif collective == "broadcast":
        expected = rank_input(count, dt, root)
        send = expected.copy() if rank == root else np.zeros(count, dtype=dt)
        out = np.empty_like(send)
        raw_buf = send.copy()
        buffers = [out] + ([] if rank == root else [raw_buf])

        def run() -> np.ndarray:
            return dlcomm.broadcast(send, root_rank=root, name=name, output=out)

        def raw() -> np.ndarray:
            comm.Bcast(raw_buf, root=root)
            return raw_buf

    else:  # alltoall: block j of every rank's buffer goes to rank j
        part = count // n
        send = rank_input(count, dt, rank)
        expected = np.concatenate([rank_input(count, dt, r)[rank * part:(rank + 1) * part]
                                   for r in range(n)])
        raw_out = np.empty(count, dtype=dt)
        buffers = [raw_out]

        def run() -> np.ndarray:
            return dlcomm.alltoall(send, name=name)[0]

        def raw() -> np.ndarray:
            comm.Alltoall(send, raw_out)
            return raw_out

    def reset() -> None:
        for b in buffers:
            b.fill(_SENTINEL)

    return Case(collective=collective, nbytes=count * dt.itemsize, count=count, dtype=dt,
                expected=expected, run_dlcomm=run, run_raw=None if unavailable else raw,
                raw_unavailable=unavailable, reset=reset)
