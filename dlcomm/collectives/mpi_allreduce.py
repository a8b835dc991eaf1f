"""The ``mpi`` all-reduce: MPI's own ``Allreduce`` (through the transport), the reference the
others are tested against and the default until a benchmark shows another algorithm faster.
``native`` is its earlier name, still accepted."""
from __future__ import annotations

import numpy as np

from dlcomm.collectives.buffers import (
    CommLike,
    check_comm,
    check_send_recv_pair,
    is_same_buffer,
    raise_collective_errors,
)
from dlcomm.collectives.reduction import as_collective_op
from dlcomm.ops import ReduceOp


@raise_collective_errors
def mpi_allreduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """All-reduce with MPI's ``Allreduce`` (MPI picks the algorithm); returns ``recvbuf``.

    Same contract as the point-to-point algorithms: contiguous 1-D numpy arrays of equal
    size and dtype, ``sendbuf is recvbuf`` for in place.
    """
    comm = check_comm(comm)
    op = as_collective_op(op)
    send, recv = check_send_recv_pair(sendbuf, recvbuf)
    comm.plain.allreduce(recv if is_same_buffer(send, recv) else send, recv, op)
    return recv


native_allreduce = mpi_allreduce  # the name it had; DLCOMM_ALLREDUCE_ALGORITHM=native too
