"""Recursive halving-doubling all-reduce (Rabenseifner's algorithm).

A reduce-scatter by recursive halving (log2 p exchanges of n/2, n/4, ... elements) is
followed by an all-gather by recursive doubling. It moves the same ``2 (p-1)/p * n`` bytes
per rank as the ring but needs only ``2 log2 p`` latencies. For a rank count that is not
a power of two, the first ``2 * rem`` ranks (``rem = p - 2**floor(log2 p)``) pair up
before and after: each even rank of a pair hands its data to the odd one, sits out, and
gets the result back at the end.
"""
from __future__ import annotations

import numpy as np

from dlcomm.collectives.buffers import (
    CommLike,
    PointToPoint,
    check_comm,
    check_send_recv_pair,
    is_same_buffer,
    raise_collective_errors,
)
from dlcomm.collectives.chunking import displacements, equal_counts
from dlcomm.collectives.reduction import reduce_into, reduction_ufunc
from dlcomm.collectives.tags import CollectiveTag
from dlcomm.ops import ReduceOp


def largest_power_of_two_at_most(value: int) -> int:
    """The largest power of two that is <= ``value`` (``value`` >= 1)."""
    if value < 1:
        raise ValueError(f"value must be >= 1, got {value}")
    return 1 << (value.bit_length() - 1)


def _participant_rank(rank: int, extra: int) -> int:
    """Rank inside the power-of-two group, or -1 for an even rank that sits out."""
    if rank < 2 * extra:
        return -1 if rank % 2 == 0 else rank // 2
    return rank - extra


def _world_rank(participant: int, extra: int) -> int:
    """Inverse of ``_participant_rank`` for ranks that take part."""
    return participant * 2 + 1 if participant < extra else participant + extra


@raise_collective_errors
def rhd_allreduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """All-reduce ``sendbuf`` into ``recvbuf`` by recursive halving then recursive doubling.

    Buffers are contiguous 1-D numpy arrays of the same size and dtype on every rank;
    ``sendbuf is recvbuf`` reduces in place. Returns ``recvbuf``.
    """
    comm = check_comm(comm)
    ufunc = reduction_ufunc(op)
    send, recv = check_send_recv_pair(sendbuf, recvbuf)
    if not is_same_buffer(send, recv):
        np.copyto(recv, send)
    size, rank = comm.size, comm.rank
    if size == 1:
        return recv
    group = largest_power_of_two_at_most(size)
    extra = size - group
    me = _participant_rank(rank, extra)

    # Fold: the extra (even) ranks hand their whole buffer to their odd partner.
    if rank < 2 * extra:
        if me < 0:
            comm.send(recv, rank + 1, CollectiveTag.RHD_FOLD)
        else:
            incoming = np.empty_like(recv)
            comm.recv(incoming, rank - 1, CollectiveTag.RHD_FOLD)
            reduce_into(recv, incoming, ufunc)

    if me >= 0:
        offsets = displacements(equal_counts(recv.size, group))
        _halving_reduce_scatter(comm, recv, offsets, me, group, extra, ufunc)
        _doubling_allgather(comm, recv, offsets, me, group, extra)

    # Unfold: the odd partners hand the result back.
    if rank < 2 * extra:
        if me < 0:
            comm.recv(recv, rank + 1, CollectiveTag.RHD_UNFOLD)
        else:
            comm.send(recv, rank - 1, CollectiveTag.RHD_UNFOLD)
    return recv


def _block_span(offsets: list[int], first_block: int, blocks: int) -> tuple[int, int]:
    """Element range covered by ``blocks`` consecutive blocks starting at ``first_block``."""
    return offsets[first_block], offsets[first_block + blocks]


def _halving_reduce_scatter(
    comm: PointToPoint, work: np.ndarray, offsets: list[int], me: int, group: int,
    extra: int, ufunc: np.ufunc,
) -> None:
    """Halve the owned range log2(group) times; participant ``me`` ends owning block ``me``.

    At distance ``d`` (group/2 down to 1) the partner is ``me ^ d``; each keeps the
    d-block half that contains its own index and sends the other half.
    """
    incoming = np.empty(max(offsets[i + 1] - offsets[i] for i in range(group)) * (group // 2),
                        dtype=work.dtype)
    distance = group // 2
    while distance >= 1:
        partner = me ^ distance
        keep_lo, keep_hi = _block_span(offsets, (me // distance) * distance, distance)
        give_lo, give_hi = _block_span(offsets, (partner // distance) * distance, distance)
        n_keep = keep_hi - keep_lo
        comm.sendrecv_into(
            work[give_lo:give_hi], _world_rank(partner, extra),
            incoming[:n_keep], _world_rank(partner, extra),
            CollectiveTag.RHD_REDUCE_SCATTER,
        )
        reduce_into(work[keep_lo:keep_hi], incoming[:n_keep], ufunc)
        distance //= 2


def _doubling_allgather(
    comm: PointToPoint, work: np.ndarray, offsets: list[int], me: int, group: int,
    extra: int,
) -> None:
    """Double the owned range log2(group) times until every participant holds all blocks."""
    distance = 1
    while distance < group:
        partner = me ^ distance
        mine_lo, mine_hi = _block_span(offsets, (me // distance) * distance, distance)
        theirs_lo, theirs_hi = _block_span(offsets, (partner // distance) * distance, distance)
        comm.sendrecv_into(
            work[mine_lo:mine_hi], _world_rank(partner, extra),
            work[theirs_lo:theirs_hi], _world_rank(partner, extra),
            CollectiveTag.RHD_ALLGATHER,
        )
        distance *= 2
