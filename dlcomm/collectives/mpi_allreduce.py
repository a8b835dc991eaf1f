"""The ``native`` all-reduce: MPI's own ``Allreduce``, the reference the others are tested
against and the default until a benchmark shows another algorithm faster."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from dlcomm.collectives.buffers import (
    check_comm,
    check_send_recv_pair,
    is_same_buffer,
    raise_collective_errors,
)
from dlcomm.collectives.reduction import mpi_op
from dlcomm.ops import ReduceOp


@raise_collective_errors
def native_allreduce(
    comm: MPI.Intracomm,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
) -> np.ndarray:
    """All-reduce with ``comm.Allreduce`` (MPI picks the algorithm); returns ``recvbuf``.

    Same contract as the point-to-point algorithms: contiguous 1-D numpy arrays of equal
    size and dtype, ``sendbuf is recvbuf`` for in place. The dtype must have an MPI
    equivalent (float16 does not).
    """
    comm = check_comm(comm)
    mpi_operator = mpi_op(op)
    send, recv = check_send_recv_pair(sendbuf, recvbuf)
    source = MPI.IN_PLACE if is_same_buffer(send, recv) else send
    comm.Allreduce(source, recv, op=mpi_operator)
    return recv
