"""Binomial-tree reduce, broadcast, and the tree all-reduce (reduce to a root, broadcast back).

Each phase takes ``ceil(log2 p)`` rounds but every round moves the whole buffer, so the
tree wins for small messages, where latency dominates, and loses to the ring and to
halving-doubling for large ones.
"""
from __future__ import annotations

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
from dlcomm.collectives.reduction import reduce_into, reduction_ufunc
from dlcomm.collectives.tags import CollectiveTag
from dlcomm.ops import ReduceOp


def _check_root(root: object, size: int) -> int:
    """Require an integer root in ``[0, size)``."""
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise TypeError(f"root must be an integer rank, got {root!r}")
    if not 0 <= root < size:
        raise ValueError(f"root {root} is outside the communicator's ranks 0..{size - 1}")
    return int(root)


def binomial_reduce_inplace(
    comm: PointToPoint, work: np.ndarray, ufunc: np.ufunc, root: int = 0
) -> None:
    """Reduce every rank's ``work`` into ``work`` on ``root`` along a binomial tree.

    With relative rank ``v = (rank - root) mod p``, in round k a rank whose bit k is set
    sends its partial result to ``v - 2**k`` and stops; the others receive from
    ``v + 2**k`` when that rank exists. ``work`` on non-root ranks ends partially reduced.
    """
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    relative = (rank - root) % size
    incoming = None
    mask = 1
    while mask < size:
        if relative & mask:
            comm.send(work, (relative - mask + root) % size, CollectiveTag.TREE_REDUCE)
            return
        child = relative + mask
        if child < size:
            if incoming is None:
                incoming = np.empty_like(work)
            comm.recv(incoming, (child + root) % size, CollectiveTag.TREE_REDUCE)
            reduce_into(work, incoming, ufunc)
        mask <<= 1


def binomial_broadcast_inplace(comm: PointToPoint, buf: np.ndarray, root: int = 0) -> None:
    """Copy ``buf`` from ``root`` to every rank along a binomial tree (no argument checks)."""
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    relative = (rank - root) % size
    mask = 1
    while mask < size:  # receive once, from the parent that clears our lowest set bit
        if relative & mask:
            comm.recv(buf, (relative - mask + root) % size, CollectiveTag.TREE_BROADCAST)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # then forward to the children below that bit
        if relative + mask < size:
            comm.send(buf, (relative + mask + root) % size, CollectiveTag.TREE_BROADCAST)
        mask >>= 1


@raise_collective_errors
def binomial_broadcast(comm: CommLike, buf: np.ndarray, root: int = 0) -> np.ndarray:
    """Broadcast ``buf`` from ``root`` to all ranks in place along a binomial tree.

    ``buf`` is a contiguous 1-D numpy array of the same size and dtype on every rank.
    Returns ``buf``.
    """
    comm = check_comm(comm)
    root = _check_root(root, comm.size)
    buf = check_flat_array("buf", buf, writeable=True)
    binomial_broadcast_inplace(comm, buf, root)
    return buf


@raise_collective_errors
def binomial_reduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
    root: int = 0,
) -> np.ndarray:
    """Reduce ``sendbuf`` of all ranks into ``recvbuf`` on ``root`` along a binomial tree.

    ``recvbuf`` is written on every rank (it is the working buffer) but holds the full
    result only on ``root``. ``sendbuf is recvbuf`` reduces in place. Returns ``recvbuf``.
    """
    comm = check_comm(comm)
    ufunc = reduction_ufunc(op)
    root = _check_root(root, comm.size)
    send, recv = check_send_recv_pair(sendbuf, recvbuf)
    if not is_same_buffer(send, recv):
        np.copyto(recv, send)
    binomial_reduce_inplace(comm, recv, ufunc, root)
    return recv


@raise_collective_errors
def tree_allreduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """All-reduce by a binomial reduce to rank 0 followed by a binomial broadcast from it.

    Buffers are contiguous 1-D numpy arrays of the same size and dtype on every rank;
    ``sendbuf is recvbuf`` reduces in place. Returns ``recvbuf``.
    """
    comm = check_comm(comm)
    ufunc = reduction_ufunc(op)
    send, recv = check_send_recv_pair(sendbuf, recvbuf)
    if not is_same_buffer(send, recv):
        np.copyto(recv, send)
    binomial_reduce_inplace(comm, recv, ufunc, 0)
    binomial_broadcast_inplace(comm, recv, 0)
    return recv
