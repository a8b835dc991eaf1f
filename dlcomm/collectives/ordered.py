"""The ``ordered`` all-reduce and reduce-scatter: every element is reduced in rank order.

MPI's own collectives combine the ranks' contributions in an order chosen by the algorithm
MPI picks, and that order depends on the message size and on where an element sits in the
buffer. Floating-point addition is not associative, so with 3 or more ranks the same
gradient gets different last bits depending on how tensors are fused or split: an
all-reduce and a reduce-scatter followed by an all-gather of the same data disagree (the
``dear`` schedule against ``wfbp``). Here each element is reduced as
``((x_0 + x_1) + x_2) + ... + x_{p-1}`` over ranks 0..p-1, whatever buffer it travels in, so
every schedule, bucket size and fusion threshold gives the same bits, on every rank.

The reduce-scatter is one all-to-all (each rank receives every rank's copy of its own
block: ``(p-1)/p`` of the buffer, as a ring reduce-scatter sends) and a local reduction in
rank order; the all-reduce all-gathers the reduced blocks afterwards. Buffers whose copies
from all ranks fit in ``SMALL_GATHER_BYTES`` are all-gathered whole instead (one collective
instead of two) and reduced in the same order, so the choice does not change the result.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dlcomm.collectives.buffers import (
    CommLike,
    check_comm,
    check_send_recv_pair,
    is_same_buffer,
    raise_collective_errors,
)
from dlcomm.collectives.chunking import displacements, equal_counts, validate_counts
from dlcomm.collectives.reduction import reduction_ufunc
from dlcomm.comm.mesh_communicator import mesh_communicator
from dlcomm.comm.rank_order import reduce_in_rank_order
from dlcomm.ops import ReduceOp

# An all-reduce whose p copies of the buffer take at most this many bytes gathers them whole.
SMALL_GATHER_BYTES = 64 * 1024


@raise_collective_errors
def ordered_reduce_scatter(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    counts: Sequence[int],
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """Reduce ``sendbuf`` over all ranks in rank order; rank r keeps block r in ``recvbuf``.

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
        raise ValueError(f"recvbuf has {recv.size} elements but counts[{rank}] is {counts[rank]}")
    if size == 1:
        np.copyto(recv, send)
        return recv
    mine = counts[rank]
    copies = np.empty((size, mine), dtype=send.dtype)  # copies[j]: rank j's block `rank`
    comm.alltoallv(send, list(counts), copies.reshape(-1), [mine] * size)
    reduce_in_rank_order(copies, recv, ufunc)
    return recv


@raise_collective_errors
def ordered_allreduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """All-reduce ``sendbuf`` into ``recvbuf``, each element reduced in rank order.

    Buffers are contiguous 1-D numpy arrays of the same size and dtype on every rank;
    ``sendbuf is recvbuf`` reduces in place. Returns ``recvbuf``.
    """
    comm = check_comm(comm)
    ufunc = reduction_ufunc(op)
    send, recv = check_send_recv_pair(sendbuf, recvbuf)
    size = comm.size
    if size == 1:
        if not is_same_buffer(send, recv):
            np.copyto(recv, send)
        return recv
    if recv.size == 0:
        return recv
    if send.nbytes * size <= SMALL_GATHER_BYTES:
        copies = np.empty((size, send.size), dtype=send.dtype)
        comm.allgatherv(send, copies.reshape(-1), [send.size] * size)
        reduce_in_rank_order(copies, recv, ufunc)
        return recv
    counts = equal_counts(send.size, size)
    block = np.empty(counts[comm.rank], dtype=send.dtype)
    ordered_reduce_scatter(comm, send, block, counts, op)
    # sendbuf was consumed by the all-to-all, so recvbuf may be the same memory.
    comm.allgatherv(block, recv, list(counts))
    return recv


# The TCP mesh's ordered all-reduce cuts every block into segments of about this many bytes
# (at most MESH_SEGMENTS), so all-gathering the first segments overlaps scattering the rest.
MESH_SEGMENT_BYTES = 1 << 20
MESH_SEGMENTS = 16


@raise_collective_errors
def ordered_tcp_allreduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """``ordered_allreduce`` over the communicator's TCP mesh (``dlcomm.comm.tcp_mesh``;
    built collectively on first use): the same bits, sent by threads that keep the links
    busy, with the all-to-all and the all-gather pipelined segment by segment. Over MPI when
    the mesh is off or unavailable."""
    comm = check_comm(comm)
    ufunc = reduction_ufunc(op)
    mesh = mesh_communicator(comm)
    send, recv = check_send_recv_pair(sendbuf, recvbuf)
    if mesh is None or recv.size == 0 or send.nbytes * comm.size <= SMALL_GATHER_BYTES:
        return ordered_allreduce(mesh or comm, sendbuf, recvbuf, op)
    _pipelined_over_mesh(mesh, send, recv, ufunc)
    return recv


def _pipelined_over_mesh(mesh: Any, send: np.ndarray, recv: np.ndarray,
                         ufunc: np.ufunc) -> None:
    """Scatter every segment at once; reduce each as it arrives (in rank order) and queue
    its all-gather behind the scatter on every connection. Each connection carries its
    messages in order, so the all-gathered segments follow the scattered ones and the links
    stay busy across the two phases. In place is safe: a peer all-gathers a segment of its
    block only after it received this rank's copy of that segment."""
    size, rank = mesh.size, mesh.rank
    counts = equal_counts(send.size, size)
    offsets = displacements(counts)
    segments = max(1, min(MESH_SEGMENTS, -(-max(counts) * send.itemsize // MESH_SEGMENT_BYTES)))

    def cut(block: int, i: int) -> int:  # start of segment i of ``block`` (the same everywhere)
        return offsets[block] + counts[block] * i // segments

    mine = counts[rank]
    peers = [p for p in range(size) if p != rank]
    copies = np.empty((size, mine), dtype=send.dtype)  # copies[j]: rank j's block ``rank``
    copies[rank] = send[offsets[rank]:offsets[rank + 1]]
    own = [(cut(rank, i) - offsets[rank], cut(rank, i + 1) - offsets[rank])
           for i in range(segments)]  # this rank's segments, within its block
    scattered = []
    for i, (lo, hi) in enumerate(own):
        scattered.append(mesh.start_exchange(
            [(p, send[cut(p, i):cut(p, i + 1)]) for p in peers],
            [(p, copies[p, lo:hi]) for p in peers]))
    gathered = mesh.start_exchange(
        [], [(p, recv[cut(p, i):cut(p, i + 1)]) for i in range(segments) for p in peers])
    result = recv[offsets[rank]:offsets[rank + 1]]
    sent = []
    for transfer, (lo, hi) in zip(scattered, own):
        transfer.wait()
        reduce_in_rank_order(copies[:, lo:hi], result[lo:hi], ufunc)
        sent.append(mesh.start_exchange([(p, result[lo:hi]) for p in peers], []))
    for transfer in sent:
        transfer.wait()
    gathered.wait()


@raise_collective_errors
def ordered_tcp_reduce_scatter(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    counts: Sequence[int],
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """``ordered_reduce_scatter`` over the TCP mesh (same bits; MPI without a mesh)."""
    comm = check_comm(comm)
    return ordered_reduce_scatter(mesh_communicator(comm) or comm, sendbuf, recvbuf, counts, op)
