"""NCCL backend for CuPy device arrays (``cupy.cuda.nccl``); its unique id travels over MPI.

Small on purpose: the engine negotiates over MPI as always and only moves device buffers
here. Data-path tests need a GPU and are skipped without one; the id exchange and backend
selection are tested everywhere (``nvidia-nccl-cu12`` makes ``get_unique_id`` work
without a GPU).
"""
from __future__ import annotations

from typing import Any

from dlcomm.comm.mpi_backend import as_communicator
from dlcomm.ops import ReduceOp


def exchange_unique_id(comm: Any, root: int = 0) -> bytes:
    """Rank ``root`` creates an NCCL unique id; every rank of ``comm`` (an MPI transport
    communicator, or an mpi4py one) returns it."""
    from cupy.cuda import nccl  # noqa: PLC0415 - optional dependency (GPU data path)

    comm = as_communicator(comm)
    uid = nccl.get_unique_id() if comm.rank == root else None
    uid = comm.bcast_object(uid, root=root)
    if not isinstance(uid, (bytes, tuple)) or len(uid) != 128:
        raise RuntimeError(f"bad NCCL unique id from rank {root}: {type(uid).__name__}")
    return bytes(uid) if isinstance(uid, bytes) else bytes(b % 256 for b in uid)


def _nccl_dtype(dtype: Any) -> int:
    from cupy.cuda import nccl  # noqa: PLC0415 - optional dependency (GPU data path)

    table = {
        "float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32,
        "float64": nccl.NCCL_FLOAT64, "int8": nccl.NCCL_INT8, "uint8": nccl.NCCL_UINT8,
        "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64,
    }
    name = getattr(dtype, "name", str(dtype))
    if name not in table:
        raise TypeError(f"NCCL cannot move dtype {name}; supported: {sorted(table)}")
    return table[name]


def _nccl_op(op: ReduceOp) -> int:
    from cupy.cuda import nccl  # noqa: PLC0415 - optional dependency (GPU data path)

    return {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.AVERAGE: nccl.NCCL_SUM,
            ReduceOp.MIN: nccl.NCCL_MIN, ReduceOp.MAX: nccl.NCCL_MAX,
            ReduceOp.PRODUCT: nccl.NCCL_PROD}[op]


class NCCLCommunicator:
    """A ``Communicator`` over NCCL for the ranks of ``comm`` (the MPI transport communicator
    of the same ranks, which carries the unique id; one GPU per rank)."""

    def __init__(self, comm: Any) -> None:
        import cupy  # noqa: PLC0415 - optional dependency (GPU data path)
        from cupy.cuda import nccl  # noqa: PLC0415 - optional dependency (GPU data path)

        comm = as_communicator(comm)
        self.rank = comm.rank
        self.size = comm.size
        uid = exchange_unique_id(comm)
        self._nccl = nccl
        self._comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._stream = cupy.cuda.Stream(non_blocking=True)

    def _sync(self) -> None:
        self._stream.synchronize()

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: ReduceOp) -> None:
        self._comm.allReduce(sendbuf.data.ptr, recvbuf.data.ptr, recvbuf.size,
                             _nccl_dtype(recvbuf.dtype), _nccl_op(op), self._stream.ptr)
        self._sync()

    def bcast(self, buf: Any, root: int) -> None:
        self._comm.broadcast(buf.data.ptr, buf.data.ptr, buf.size, _nccl_dtype(buf.dtype),
                             root, self._stream.ptr)
        self._sync()

    def allgatherv(self, sendbuf: Any, recvbuf: Any, counts: list[int]) -> None:
        # NCCL has no v-variant: one broadcast per rank, grouped into one launch.
        dtype = _nccl_dtype(recvbuf.dtype)
        self._nccl.groupStart()
        offset = 0
        for root, count in enumerate(counts):
            dst = recvbuf[offset:offset + count]
            src = sendbuf if root == self.rank else dst
            self._comm.broadcast(src.data.ptr, dst.data.ptr, count, dtype, root,
                                 self._stream.ptr)
            offset += count
        self._nccl.groupEnd()
        self._sync()

    def alltoallv(self, sendbuf: Any, sendcounts: list[int], recvbuf: Any,
                  recvcounts: list[int]) -> None:
        dtype = _nccl_dtype(recvbuf.dtype)
        self._nccl.groupStart()
        s = r = 0
        for peer in range(self.size):
            self._comm.send(sendbuf[s:s + sendcounts[peer]].data.ptr, sendcounts[peer], dtype,
                            peer, self._stream.ptr)
            self._comm.recv(recvbuf[r:r + recvcounts[peer]].data.ptr, recvcounts[peer], dtype,
                            peer, self._stream.ptr)
            s += sendcounts[peer]
            r += recvcounts[peer]
        self._nccl.groupEnd()
        self._sync()

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: list[int],
                       op: ReduceOp) -> None:
        if len(set(counts)) == 1:
            self._comm.reduceScatter(sendbuf.data.ptr, recvbuf.data.ptr, counts[0],
                                     _nccl_dtype(recvbuf.dtype), _nccl_op(op),
                                     self._stream.ptr)
            self._sync()
            return
        # Unequal parts: reduce everything, keep this rank's slice.
        full = sendbuf.copy()
        self.allreduce(full, full, op)
        start = sum(counts[:self.rank])
        recvbuf[...] = full[start:start + counts[self.rank]]
