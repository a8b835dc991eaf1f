"""Ring reduce-scatter, ring all-gather, and the ring all-reduce built from the two.

Each rank talks only to its two ring neighbours; every step moves one block of about
``n / p`` elements, so the ring reaches the bandwidth optimum ``2 (p-1)/p * n`` bytes
per rank for all-reduce, at the price of ``2 (p-1)`` latencies.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dlcomm.collectives.buffers import (
    CommLike,
    PointToPoint,
    check_comm,
    check_flat_array,
    check_send_recv_pair,
    is_same_buffer,
    raise_collective_errors,
)
from dlcomm.collectives.chunking import displacements, equal_counts, validate_counts
from dlcomm.collectives.reduction import reduce_into, reduction_ufunc
from dlcomm.collectives.tags import CollectiveTag
from dlcomm.comm.mesh_communicator import mesh_communicator
from dlcomm.ops import ReduceOp


def ring_reduce_scatter_inplace(
    comm: PointToPoint, work: np.ndarray, offsets: Sequence[int], ufunc: np.ufunc
) -> None:
    """Reduce ``work`` around the ring so that rank r's block r holds the full reduction.

    ``offsets`` has ``p + 1`` entries; block i is ``work[offsets[i]:offsets[i+1]]``. Other
    blocks of ``work`` are left partially reduced. At step s rank r sends block r-s-1 to
    r+1 and receives block r-s-2 from r-1, so after p-1 steps block r is complete.
    """
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    largest = max(offsets[i + 1] - offsets[i] for i in range(size))
    incoming = np.empty(largest, dtype=work.dtype)
    for step in range(size - 1):
        send_block = (rank - step - 1) % size
        recv_block = (rank - step - 2) % size
        lo, hi = offsets[recv_block], offsets[recv_block + 1]
        comm.sendrecv_into(
            work[offsets[send_block]:offsets[send_block + 1]], right,
            incoming[: hi - lo], left,
            CollectiveTag.RING_REDUCE_SCATTER,
        )
        reduce_into(work[lo:hi], incoming[: hi - lo], ufunc)


def ring_allgather_inplace(
    comm: PointToPoint, work: np.ndarray, offsets: Sequence[int]
) -> None:
    """Circulate blocks around the ring until every rank holds all of them.

    Rank r starts with block r filled in; at step s it sends block r-s to r+1 and
    receives block r-s-1 from r-1 straight into place.
    """
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    for step in range(size - 1):
        send_block = (rank - step) % size
        recv_block = (rank - step - 1) % size
        comm.sendrecv_into(
            work[offsets[send_block]:offsets[send_block + 1]], right,
            work[offsets[recv_block]:offsets[recv_block + 1]], left,
            CollectiveTag.RING_ALLGATHER,
        )


@raise_collective_errors
def ring_allreduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """All-reduce ``sendbuf`` into ``recvbuf`` with a ring reduce-scatter then a ring all-gather.

    Buffers are contiguous 1-D numpy arrays of the same size and dtype on every rank;
    ``sendbuf is recvbuf`` reduces in place. Returns ``recvbuf``.
    """
    comm = check_comm(comm)
    ufunc = reduction_ufunc(op)
    send, recv = check_send_recv_pair(sendbuf, recvbuf)
    if not is_same_buffer(send, recv):
        np.copyto(recv, send)
    offsets = displacements(equal_counts(recv.size, comm.size))
    ring_reduce_scatter_inplace(comm, recv, offsets, ufunc)
    ring_allgather_inplace(comm, recv, offsets)
    return recv


@raise_collective_errors
def ring_reduce_scatter(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    counts: Sequence[int],
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """Reduce ``sendbuf`` over all ranks and leave block ``rank`` of the result in ``recvbuf``.

    ``counts[i]`` is the number of elements of block i (the same list on every rank; zeros
    and unequal counts are allowed); ``sendbuf`` holds ``sum(counts)`` elements and
    ``recvbuf`` holds ``counts[rank]``. ``sendbuf`` is not modified. Returns ``recvbuf``.
    """
    comm = check_comm(comm)
    ufunc = reduction_ufunc(op)
    send, recv = check_send_recv_pair(sendbuf, recvbuf, same_size=False)
    size, rank = comm.size, comm.rank
    counts = validate_counts(counts, size)
    offsets = displacements(counts)
    if send.size != offsets[-1]:
        raise ValueError(f"sendbuf has {send.size} elements but sum(counts) is {offsets[-1]}")
    if recv.size != counts[rank]:
        raise ValueError(
            f"recvbuf has {recv.size} elements but counts[{rank}] is {counts[rank]}"
        )
    if size == 1:
        np.copyto(recv, send)
        return recv
    # Work on a copy so sendbuf stays intact; the ring reduces in place.
    work = send.copy()
    ring_reduce_scatter_inplace(comm, work, offsets, ufunc)
    np.copyto(recv, work[offsets[rank]:offsets[rank + 1]])
    return recv


@raise_collective_errors
def ring_allgather(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    counts: Sequence[int],
) -> np.ndarray:
    """Gather every rank's ``sendbuf`` into ``recvbuf`` on all ranks, in rank order.

    ``counts[i]`` is rank i's element count (same list everywhere; zeros and unequal
    counts allowed); ``sendbuf`` holds ``counts[rank]`` and ``recvbuf`` ``sum(counts)``
    elements. ``sendbuf`` may be the view of ``recvbuf`` at this rank's offset (in place).
    Returns ``recvbuf``.
    """
    comm = check_comm(comm)
    size, rank = comm.size, comm.rank
    counts = validate_counts(counts, size)
    send = check_flat_array("sendbuf", sendbuf)
    recv = check_flat_array("recvbuf", recvbuf, writeable=True)
    if send.dtype != recv.dtype:
        raise TypeError(f"sendbuf dtype {send.dtype} differs from recvbuf dtype {recv.dtype}")
    offsets = displacements(counts)
    if send.size != counts[rank]:
        raise ValueError(f"sendbuf has {send.size} elements but counts[{rank}] is {counts[rank]}")
    if recv.size != offsets[-1]:
        raise ValueError(f"recvbuf has {recv.size} elements but sum(counts) is {offsets[-1]}")
    own = recv[offsets[rank]:offsets[rank + 1]]
    if not is_same_buffer(send, own):
        if np.shares_memory(send, recv):
            raise ValueError(
                "sendbuf overlaps recvbuf somewhere other than this rank's block; for in-place "
                "use pass recvbuf[offset:offset + counts[rank]]"
            )
        np.copyto(own, send)
    ring_allgather_inplace(comm, recv, offsets)
    return recv


@raise_collective_errors
def ring_tcp_allreduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """``ring_allreduce`` with its messages over the communicator's TCP mesh
    (``dlcomm.comm.tcp_mesh``; over MPI when the mesh is off or unavailable)."""
    comm = check_comm(comm)
    return ring_allreduce(mesh_communicator(comm) or comm, sendbuf, recvbuf, op)
