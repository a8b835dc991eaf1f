"""MPI backend (mpi4py) for host arrays, and the control channel the engine negotiates on."""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from mpi4py import MPI

from dlcomm.ops import ReduceOp

_MPI_OPS = {
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.AVERAGE: MPI.SUM,  # the engine divides after the sum
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}

# MPI has no half-precision type: float16 travels as 2-byte integers. And Open MPI 4.1's
# vectorised ops saturate 8- and 16-bit integer sums (255 + 1 -> 255) where every other
# dtype wraps. Both are combined by user-defined ops that reinterpret the bytes with numpy
# (commutative, so MPI may use any algorithm).
_NUMPY_REDUCED = frozenset(np.dtype(t) for t in
                           (np.float16, np.int8, np.uint8, np.int16, np.uint16))
_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVERAGE: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}
_numpy_ops: dict[tuple[np.dtype, ReduceOp], MPI.Op] = {}


def _numpy_op(dtype: np.dtype, op: ReduceOp) -> MPI.Op:
    key = (dtype, op)
    if key not in _numpy_ops:
        ufunc = _UFUNCS[op]
        # numpy's float16 add runs at a few hundred MB/s; the native kernel returns the same
        # bits (tests/test_native.py) about 10x faster. It is numpy's add when not built.
        from dlcomm import native  # noqa: PLC0415 - only where float16 is reduced

        if dtype == np.float16 and ufunc is np.add and native.available():
            def ufunc(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
                native.float16_add_(a, out)

        def combine(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
            a = np.frombuffer(inbuf, dtype=dtype)
            b = np.frombuffer(inoutbuf, dtype=dtype)
            ufunc(a, b, out=b)

        _numpy_ops[key] = MPI.Op.Create(combine, commute=True)
    return _numpy_ops[key]


def _wire(buf: np.ndarray) -> np.ndarray:
    """View ``buf`` as a dtype MPI knows (float16 as int16, bool as uint8); no copy."""
    if buf.dtype == np.float16:
        return buf.view(np.int16)
    if buf.dtype == np.bool_:
        return buf.view(np.uint8)
    return buf


def _mpi_op(dtype: np.dtype, op: ReduceOp) -> MPI.Op:
    return _numpy_op(dtype, op) if dtype in _NUMPY_REDUCED else _MPI_OPS[op]


class _MPIRequest:
    def __init__(self, req: MPI.Request) -> None:
        self._req = req

    def test(self) -> bool:
        return bool(self._req.Test())


class MPICommunicator:
    """A ``Communicator`` over an ``mpi4py`` communicator (host numpy arrays)."""

    def __init__(self, comm: MPI.Comm, algorithm: Any = None,
                 reduce_scatter_algorithm: Any = None) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        # An all-reduce of dlcomm.collectives (DLCOMM_ALLREDUCE_ALGORITHM); None: MPI's own.
        self.algorithm = algorithm
        # The reduce-scatter that reduces like that all-reduce (the ``ordered`` pair, so a
        # reduce-scatter + all-gather gives the all-reduce's bits); None: MPI's own.
        self.reduce_scatter_algorithm = reduce_scatter_algorithm

    # --- data path -------------------------------------------------------------------
    def allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp) -> None:
        if recvbuf.size == 0:
            return
        if self.algorithm is not None:
            wire_op = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
            self.algorithm(self.comm, sendbuf, recvbuf, wire_op)
            return
        mpi_op = _mpi_op(recvbuf.dtype, op)
        send = MPI.IN_PLACE if sendbuf is recvbuf else _wire(sendbuf)
        self.comm.Allreduce(send, _wire(recvbuf), op=mpi_op)

    def allgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int]) -> None:
        self.comm.Allgatherv(_wire(sendbuf), [_wire(recvbuf), (counts, _displacements(counts))])

    def bcast(self, buf: np.ndarray, root: int) -> None:
        if buf.size:
            self.comm.Bcast(_wire(buf), root=root)

    def alltoallv(self, sendbuf: np.ndarray, sendcounts: list[int], recvbuf: np.ndarray,
                  recvcounts: list[int]) -> None:
        self.comm.Alltoallv(
            [_wire(sendbuf), (sendcounts, _displacements(sendcounts))],
            [_wire(recvbuf), (recvcounts, _displacements(recvcounts))],
        )

    def reduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                       op: ReduceOp) -> None:
        if not sum(counts):
            return
        if self.reduce_scatter_algorithm is not None:
            wire_op = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
            self.reduce_scatter_algorithm(self.comm, sendbuf, recvbuf, counts, wire_op)
            return
        self.comm.Reduce_scatter(_wire(sendbuf), _wire(recvbuf), recvcounts=counts,
                                 op=_mpi_op(sendbuf.dtype, op))

    # --- control path (negotiation) ------------------------------------------------------
    def iallreduce_band(self, words: np.ndarray) -> _MPIRequest:
        """Start a bitwise-AND all-reduce of ``words`` (uint64), in place."""
        return _MPIRequest(self.comm.Iallreduce(MPI.IN_PLACE, words, op=MPI.BAND))

    def allgather_object(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        """All-gather byte strings of any length (two collectives, no pickling)."""
        sizes = np.array(self.comm.allgather(len(payload)), dtype=np.int64)
        recv = np.empty(int(sizes.sum()), dtype=np.uint8)
        self.comm.Allgatherv(np.frombuffer(payload, dtype=np.uint8),
                             [recv, sizes.tolist()])
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        return [recv[offsets[i]:offsets[i + 1]].tobytes() for i in range(self.size)]

    def split(self, color: int | None, key: int) -> MPICommunicator | None:
        """Collective over this communicator; ranks passing ``None`` get ``None``."""
        sub = self.comm.Split(MPI.UNDEFINED if color is None else color, key)
        return None if sub == MPI.COMM_NULL else MPICommunicator(
            sub, self.algorithm, self.reduce_scatter_algorithm)

    def dup(self) -> MPICommunicator:
        return MPICommunicator(self.comm.Dup(), self.algorithm, self.reduce_scatter_algorithm)

    def free(self) -> None:
        if self.comm not in (MPI.COMM_WORLD, MPI.COMM_SELF, MPI.COMM_NULL):
            self.comm.Free()


def _displacements(counts: list[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def dumps(obj: Any) -> bytes:
    """Serialise a control message (negotiation announcements)."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


loads = pickle.loads
