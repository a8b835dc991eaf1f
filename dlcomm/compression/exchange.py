"""Compressed all-reduce over a communicator: the one driver of compressors' rounds.

``run_rounds`` drives the rounds (see ``base``) of one or many tensors with three collectives
from a small ``ExchangeComm`` protocol: all-reduce sum, all-gather of variable-sized arrays,
and pairwise send-receive for gTop-k's merge tree. The transport's communicator
(``dlcomm.comm``) provides it; ``MPICommAdapter(mpi4py_comm)`` wraps an mpi4py one.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dlcomm.array_api import array_namespace, from_host, to_host
from dlcomm.compression.base import (
    ALLGATHER,
    ALLREDUCE,
    GROUPS,
    REDUCE_SCATTER,
    SPARSE_MERGE,
    WORLD,
    Compressor,
    Context,
    check_tensor,
)
from dlcomm.compression.topology import HostGroups, host_groups
from dlcomm.ops import ReduceOp


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
    compressor: Compressor, tensor: object, name: str, comm: ExchangeComm, average: bool = True,
    phase: Callable[[int, str], AbstractContextManager] | None = None,
) -> object:
    """All-reduce ``tensor`` across ``comm`` through ``compressor``; every rank gets the same
    array of the input's shape and dtype (the mean with ``average``, else the sum).
    ``phase`` (optional) wraps the compress and the decompress, as in ``run_rounds``.

    Tensors the compressor does not compress (``compresses``: small or 1-D, or a
    ``DenseStart``'s first exchanges) go dense.
    """
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor must be a Compressor, got {type(compressor).__name__}")
    check_tensor(tensor, name)
    if not isinstance(comm, ExchangeComm):
        raise TypeError("comm must provide size, rank, allreduce_sum, allgather and sendrecv")
    ((out, summed),) = run_rounds([(compressor, tensor, name)], comm, average, phase=phase)
    return out / out.dtype.type(comm.size) if average and summed else out


@dataclass
class _Tensor:
    """One tensor's progress through its compressor's rounds."""

    compressor: Compressor
    payloads: list
    ctx: Context | None
    dense: bool  # bypasses compression: summed as it is in the first round
    result: Any = None

    @property
    def rounds(self) -> tuple[str, ...]:
        """This tensor's rounds: one all-reduce when it goes dense, else its compressor's."""
        return (ALLREDUCE,) if self.dense else self.compressor.rounds

    def round_kind(self, r: int) -> str | None:
        """The collective of round ``r`` for this tensor, None once it is done."""
        return self.rounds[r] if r < len(self.rounds) else None

    def round_group(self, r: int) -> str:
        """The ranks round ``r``'s collective spans (WORLD for dense tensors)."""
        return WORLD if self.dense else self.compressor.groups[r]


def run_rounds(
    items: Sequence[tuple[Compressor, object, str]], comm: ExchangeComm, average: bool,
    sum_payloads: Callable[[list], list] | None = None,
    phase: Callable[[int, str], AbstractContextManager] | None = None,
    outs: Sequence[object | None] | None = None,
) -> list[tuple[object, bool]]:
    """Drive the compressors' rounds for several tensors at once: the one round loop of
    compressed all-reduce, behind ``compressed_allreduce`` and the engine's fused path.

    ``items`` are ``(compressor, tensor, name)``; tensors a compressor does not compress
    (``Compressor.compresses``) go dense in the first round, the others go through
    ``compressor.for_tensor`` (itself, or the compressor a choice picks for the tensor). In each
    round, after the gathers and merges, the world's all-reduce payloads of every tensor
    are summed together by
    ``sum_payloads(arrays) -> sums`` (default: one ``comm.allreduce_sum`` per array; the engine
    passes one that fuses them); per group of ranks (``Compressor.groups``: the world, or HOST
    and PEER sub-communicators from ``topology.host_groups``, whose ``HostTopology`` the driver
    puts in ``ctx.topology``) its all-gather payloads travel in one packed all-gather
    (``allgather_batch``) and its merge trees exchange every tensor's payloads in one message
    per step (``sparse_tree_merge_batch``); reduce-scatter rounds and all-reduce rounds over a
    group run per tensor, in order.
    ``phase(index, name)`` (optional) wraps each tensor's compress and decompress, for the
    timeline. ``outs`` (optional, one array or None per tensor): where a tensor's all-gathered
    result can be combined straight into its array (``Compressor.decompress_all_into``), it
    is, and that array is its value. Returns ``(value, summed)`` per tensor: the sum over
    ranks when ``summed`` (divide by ``comm.size`` to average), else already combined as
    ``average`` asks.
    """
    if outs is not None and len(outs) != len(items):
        raise ValueError(f"outs has {len(outs)} entries for {len(items)} tensors")
    if sum_payloads is None:
        def sum_payloads(arrays: list) -> list:
            return [comm.allreduce_sum(a) for a in arrays]
    if phase is None:
        def phase(index: int, name: str) -> AbstractContextManager:
            return contextlib.nullcontext()
    tensors: list[_Tensor] = []
    for i, (compressor, tensor, name) in enumerate(items):
        with phase(i, "compress"):
            if compressor.compresses(tensor, name):
                chosen = compressor.for_tensor(tensor, name, comm)
                tensors.append(_Tensor(chosen, *chosen.compress(tensor, name), False))
            else:  # small or 1-D, or within DenseStart's first exchanges
                tensors.append(_Tensor(compressor, [tensor], None, True))
    hosts = _host_groups_for(tensors, comm)
    rounds = max((len(t.rounds) for t in tensors), default=1)
    for r in range(rounds):
        # The gathers and merges go first: their waits poll, so ranks that finished
        # compressing early sleep there until the slowest arrives, rather than in the sums'
        # blocking MPI all-reduce, which spins and takes the cores the others compress on.
        for group in GROUPS:  # the same order on every rank
            gathering = [t for t in tensors
                         if t.round_kind(r) == ALLGATHER and t.round_group(r) == group]
            merging = [t for t in tensors if t.round_kind(r) == SPARSE_MERGE
                       and t.round_group(r) == group and r < len(t.rounds) - 1]
            if not gathering and not merging:
                continue
            sub = comm if group == WORLD else getattr(hosts, group)
            gathered = allgather_batch(sub, [p.reshape(-1) for t in gathering
                                             for p in t.payloads])
            pos = 0
            for t in gathering:
                mine, pos = gathered[pos:pos + len(t.payloads)], pos + len(t.payloads)
                t.result = [list(per_rank) for per_rank in zip(*mine)]
            merged = sparse_tree_merge_batch(
                [(t.compressor, t.payloads, t.ctx) for t in merging], sub)
            for t, result in zip(merging, merged):
                t.result = result
        summing = [t for t in tensors
                   if t.round_kind(r) == ALLREDUCE and t.round_group(r) == WORLD]
        sums = sum_payloads([p for t in summing for p in t.payloads])
        pos = 0
        for t in summing:
            t.result, pos = sums[pos:pos + len(t.payloads)], pos + len(t.payloads)
        for t in tensors:
            kind = t.round_kind(r)
            if kind is None:
                continue
            group = t.round_group(r)
            sub = comm if group == WORLD else getattr(hosts, group)
            last = r == len(t.rounds) - 1
            if kind == ALLREDUCE and group != WORLD:
                t.result = [sub.allreduce_sum(p) for p in t.payloads]
            elif kind == REDUCE_SCATTER and not last:
                t.result = [reduce_scatter_sum(
                    sub, p, t.compressor.scatter_counts(p.size, sub.size, t.ctx))
                    for p in t.payloads]
            elif kind not in (ALLREDUCE, ALLGATHER) and not (kind == SPARSE_MERGE and not last):
                raise ValueError(f"{t.compressor.name}: round {r} of kind {kind!r} is not "
                                 "supported")
            if not t.dense and not last:
                t.payloads, t.ctx = t.compressor.resume(t.result, t.ctx)
    out: list[tuple[object, bool]] = []
    for i, t in enumerate(tensors):
        with phase(i, "decompress"):
            if t.dense:
                out.append((t.result[0], True))
            elif t.rounds[-1] == ALLREDUCE:
                out.append((t.compressor.decompress(t.result, t.ctx), True))
            else:
                op = "average" if average else "sum"
                target = None if outs is None else outs[i]
                if target is not None and t.compressor.decompress_all_into(
                        t.result, t.ctx, op, target) is not None:
                    out.append((target, False))
                else:
                    out.append((t.compressor.decompress_all(t.result, t.ctx, op), False))
    return out


# A packed message's header: the array count, then (bytes, dtype number) per array, as int64.
_ALIGN = 8  # each packed array starts on this boundary, so the views stay aligned


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _pack(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``arrays`` (1-D numpy) as one uint8 buffer: the header, then each array's bytes."""
    header = np.array([len(arrays), *[v for a in arrays for v in (a.nbytes, a.dtype.num)]],
                      dtype=np.int64)
    packed = np.zeros(header.nbytes + sum(_padded(a.nbytes) for a in arrays), dtype=np.uint8)
    packed[:header.nbytes] = header.view(np.uint8)
    at = header.nbytes
    for a in arrays:
        packed[at:at + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        at += _padded(a.nbytes)
    return packed


def _unpack(buf: np.ndarray, like: Sequence[np.ndarray], what: str, rank: int,
            source: int) -> list[np.ndarray]:
    """The arrays another rank packed (views of ``buf``), checked to be as many as ``like``
    with the same dtypes; ``ValueError`` naming both ranks otherwise."""
    size = 8 * (1 + 2 * len(like))
    theirs = np.frombuffer(buf[:size].tobytes(), dtype=np.int64)
    if theirs.size != 1 + 2 * len(like) or theirs[0] != len(like) or \
            any(int(theirs[2 + 2 * j]) != a.dtype.num for j, a in enumerate(like)):
        raise ValueError(
            f"{what}: this rank (rank {rank}) sent {len(like)} arrays of dtypes "
            f"{[a.dtype.name for a in like]}, rank {source} sent others; every rank must "
            "exchange the same tensors through the same compressor")
    out, at = [], size
    for j, a in enumerate(like):
        nbytes = int(theirs[1 + 2 * j])
        out.append(buf[at:at + nbytes].view(a.dtype))
        at += _padded(nbytes)
    return out


def _packable(arrays: Sequence[Any]) -> bool:
    """Host arrays are packed; device (CuPy) arrays go one by one, as the comm stages them."""
    return all(isinstance(a, np.ndarray) for a in arrays)


def allgather_batch(comm: ExchangeComm, arrays: Sequence[Any]) -> list[list]:
    """Every rank's copy of each 1-D array of ``arrays``, as ``[array][rank]``, in one
    all-gather of all of them packed as bytes, instead of one all-gather (two collectives:
    sizes, then bytes) per array. Every rank passes as many arrays with the same dtypes
    (sizes may differ); a mismatch raises ``ValueError`` on every rank."""
    if not arrays:
        return []
    if len(arrays) == 1 or not _packable(arrays):
        return [comm.allgather(a) for a in arrays]
    per_rank = [_unpack(buf, arrays, "batched all-gather", comm.rank, source)
                for source, buf in enumerate(comm.allgather(_pack(arrays)))]
    return [list(per_array) for per_array in zip(*per_rank)]


def sendrecv_batch(comm: ExchangeComm, arrays: Sequence[Any], peer: int) -> list:
    """Send the 1-D ``arrays`` to ``peer`` in one message and return the arrays ``peer``
    sent (as many, with the same dtypes; sizes may differ)."""
    if not _packable(arrays):
        return [comm.sendrecv(a, peer) for a in arrays]
    return _unpack(comm.sendrecv(_pack(arrays), peer), arrays, "batched send-receive",
                   comm.rank, peer)


def reduce_scatter_sum(comm: ExchangeComm, arr: object, counts: list[int]) -> object:
    """This rank's part of the sum of 1-D ``arr`` over ``comm``: rank ``i`` gets the
    ``counts[i]`` elements after the first ``sum(counts[:i])``. A transport communicator
    reduce-scatters (MPI); other ``ExchangeComm``s all-reduce and keep their part."""
    if len(counts) != comm.size or sum(counts) != arr.size or min(counts) < 0:
        raise ValueError(f"scatter counts {counts} do not split {arr.size} elements over "
                         f"{comm.size} ranks")
    lo = sum(counts[:comm.rank])
    reduce_scatter = getattr(comm, "reduce_scatter", None)
    if reduce_scatter is None or comm.size == 1:
        return comm.allreduce_sum(arr.reshape(-1))[lo:lo + counts[comm.rank]]
    host = np.ascontiguousarray(to_host(arr)).reshape(-1)
    out = np.empty(counts[comm.rank], dtype=host.dtype)
    reduce_scatter(host, out, list(counts), ReduceOp.SUM)
    return from_host(out, arr)


def _host_groups_for(tensors: list[_Tensor], comm: ExchangeComm) -> HostGroups | None:
    """The HOST and PEER communicators when a compressed tensor has rounds over them (and
    its context gets the topology); None otherwise. A last all-reduce round must span the
    world (its result is a sum over all ranks); a last all-gather may span a group, when the
    compressor's ``decompress_all`` rebuilds the world's result from it."""
    grouped = [t for t in tensors if not t.dense and set(t.compressor.groups) != {WORLD}]
    if not grouped:
        return None
    for t in grouped:
        groups = t.compressor.groups
        if len(groups) != len(t.compressor.rounds) or not set(groups) <= set(GROUPS):
            raise ValueError(f"{t.compressor.name}: groups {list(groups)} must name one of "
                             f"{list(GROUPS)} per round")
        if t.compressor.rounds[-1] == ALLREDUCE and groups[-1] != WORLD:
            raise ValueError(f"{t.compressor.name}: a last all-reduce round must span "
                             "every rank")
    hosts = host_groups(comm)
    for t in grouped:
        t.ctx.topology = hosts.topology
    return hosts


def sparse_tree_merge(
    compressor: Compressor, payloads: list, ctx: Context, comm: ExchangeComm
) -> list:
    """Merge every rank's sparse payloads pairwise; all ranks return the same merged payloads.

    With P = 2^m + e ranks, ranks 2^m.. first hand their payloads to rank r - 2^m, the 2^m
    ranks then run m recursive-doubling rounds (partners r and r xor 2^i merge in rank order,
    so both compute the same result), and the result goes back to the e extra ranks:
    m rounds for a power of two, m + 2 otherwise.
    """
    return sparse_tree_merge_batch([(compressor, payloads, ctx)], comm)[0]


def sparse_tree_merge_batch(
    entries: Sequence[tuple[Compressor, list, Context]], comm: ExchangeComm
) -> list[list]:
    """``sparse_tree_merge`` of several tensors ``(compressor, payloads, ctx)`` at once:
    each step of the tree sends every tensor's payloads to the partner in one message."""
    size, rank = comm.size, comm.rank
    mine = [list(payloads) for _, payloads, _ in entries]
    if size == 1 or not entries:
        return mine
    empty = [[array_namespace(p).empty(0, dtype=p.dtype) for p in payloads]
             for payloads in mine]
    base = 1 << (size.bit_length() - 1)
    extra = size - base

    def swap(lists: list[list], peer: int) -> list[list]:
        """Send our payloads to ``peer`` and receive theirs, every tensor's in one message."""
        got = iter(sendrecv_batch(comm, [p.reshape(-1) for ps in lists for p in ps], peer))
        return [[next(got) for _ in ps] for ps in lists]

    def merge(first: list[list], second: list[list]) -> list[list]:
        return [c.merge(a, b, ctx) for (c, _, ctx), a, b in zip(entries, first, second)]

    if rank >= base:
        swap(mine, rank - base)
        return swap(empty, rank - base)
    if rank < extra:
        mine = merge(mine, swap(empty, rank + base))
    mask = 1
    while mask < base:
        peer = rank ^ mask
        theirs = swap(mine, peer)
        mine = merge(mine, theirs) if rank < peer else merge(theirs, mine)
        mask <<= 1
    if rank < extra:
        swap(mine, rank + base)
    return mine
