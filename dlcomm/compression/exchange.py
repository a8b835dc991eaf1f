"""Compressed all-reduce of one tensor over a communicator (the unfused path).

``compressed_allreduce`` drives a compressor's rounds (see ``base``) with three collectives
from a small ``ExchangeComm`` protocol: all-reduce sum, all-gather of variable-sized arrays,
and pairwise send-receive for gTop-k's merge tree. The transport's communicator
(``dlcomm.comm``) provides it; ``MPICommAdapter(mpi4py_comm)`` wraps an mpi4py one.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from dlcomm.array_api import array_namespace
from dlcomm.compression.base import (
    ALLGATHER,
    ALLREDUCE,
    SPARSE_MERGE,
    Compressor,
    Context,
    check_tensor,
)


@runtime_checkable
class ExchangeComm(Protocol):
    """The collectives compressed exchange needs; every rank calls them in the same order."""

    size: int
    rank: int

    def allreduce_sum(self, arr: object) -> object:
        """Element-wise sum of ``arr`` over ranks (same shape and dtype on every rank)."""

    def allgather(self, arr: object) -> list:
        """Every rank's 1-D ``arr`` (sizes may differ, dtype may not), in rank order."""

    def sendrecv(self, arr: object, peer: int) -> object:
        """Send 1-D ``arr`` to ``peer`` and return what ``peer`` sent (any size, same dtype)."""


class SelfComm:
    """A one-rank ``ExchangeComm``: collectives return their input (single-process runs)."""

    size = 1
    rank = 0

    def allreduce_sum(self, arr: object) -> object:
        return arr.copy()

    def allgather(self, arr: object) -> list:
        return [arr.copy()]

    def sendrecv(self, arr: object, peer: int) -> object:
        raise ValueError(f"a one-rank communicator has no peer {peer}")


def MPICommAdapter(mpi_comm: object) -> ExchangeComm:  # noqa: N802 - its name as a class
    """An mpi4py communicator as an ``ExchangeComm``: the transport's communicator over it."""
    # Importing the transport imports mpi4py.MPI, which starts MPI: only when asked for.
    from dlcomm.comm.mpi_backend import as_communicator  # noqa: PLC0415 - MPI start-up

    return as_communicator(mpi_comm)


def compressed_allreduce(
    compressor: Compressor, tensor: object, name: str, comm: ExchangeComm, average: bool = True
) -> object:
    """All-reduce ``tensor`` across ``comm`` through ``compressor``; every rank gets the same
    array of the input's shape and dtype (the mean with ``average``, else the sum).

    Tensors the compressor does not apply to (``applies_to``: small or 1-D) go dense.
    """
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor must be a Compressor, got {type(compressor).__name__}")
    check_tensor(tensor, name)
    if not isinstance(comm, ExchangeComm):
        raise TypeError("comm must provide size, rank, allreduce_sum, allgather and sendrecv")
    op = "average" if average else "sum"
    if not compressor.applies_to(tensor):
        out = comm.allreduce_sum(tensor)
        return out / out.dtype.type(comm.size) if average else out
    payloads, ctx = compressor.compress(tensor, name)
    rounds = compressor.rounds
    for i, kind in enumerate(rounds):
        if kind == ALLREDUCE:
            result = [comm.allreduce_sum(p) for p in payloads]
        elif kind == ALLGATHER:
            gathered = [comm.allgather(p.reshape(-1)) for p in payloads]
            result = [list(per_rank) for per_rank in zip(*gathered)]
        elif kind == SPARSE_MERGE and i < len(rounds) - 1:
            result = sparse_tree_merge(compressor, payloads, ctx, comm)
        else:
            raise ValueError(f"{compressor.name}: round {i} of kind {kind!r} is not supported")
        if i < len(rounds) - 1:
            payloads, ctx = compressor.resume(result, ctx)
    if rounds[-1] == ALLREDUCE:
        out = compressor.decompress(result, ctx)
        return out / out.dtype.type(comm.size) if average else out
    return compressor.decompress_all(result, ctx, op)


def sparse_tree_merge(
    compressor: Compressor, payloads: list, ctx: Context, comm: ExchangeComm
) -> list:
    """Merge every rank's sparse payloads pairwise; all ranks return the same merged payloads.

    With P = 2^m + e ranks, ranks 2^m.. first hand their payloads to rank r - 2^m, the 2^m
    ranks then run m recursive-doubling rounds (partners r and r xor 2^i merge in rank order,
    so both compute the same result), and the result goes back to the e extra ranks:
    m rounds for a power of two, m + 2 otherwise.
    """
    size, rank = comm.size, comm.rank
    mine = list(payloads)
    if size == 1:
        return mine
    xp = array_namespace(mine[0])
    empty = [xp.empty(0, dtype=p.dtype) for p in mine]
    base = 1 << (size.bit_length() - 1)
    extra = size - base
    if rank >= base:
        _swap(comm, mine, rank - base)
        return _swap(comm, empty, rank - base)
    if rank < extra:
        mine = compressor.merge(mine, _swap(comm, empty, rank + base), ctx)
    mask = 1
    while mask < base:
        peer = rank ^ mask
        theirs = _swap(comm, mine, peer)
        mine = compressor.merge(mine, theirs, ctx) if rank < peer else \
            compressor.merge(theirs, mine, ctx)
        mask <<= 1
    if rank < extra:
        _swap(comm, mine, rank + base)
    return mine


def _swap(comm: ExchangeComm, payloads: list, peer: int) -> list:
    """Send our payloads to ``peer`` and receive theirs, one array at a time."""
    return [comm.sendrecv(p.reshape(-1), peer) for p in payloads]
