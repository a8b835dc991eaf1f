"""``ExchangeComm`` over an mpi4py communicator, for compressed exchange on CPU arrays.

CuPy arrays are staged through host memory (a CUDA-aware path belongs to the NCCL backend).
Open MPI has no float16 datatype, so float16 sums use a user-defined MPI operation.
"""
from __future__ import annotations

import numpy as np

from dlcomm.array_api import from_host, to_host
from dlcomm.errors import DLCommError


def _fp16_sum(inbuf: object, inoutbuf: object, datatype: object) -> None:
    """MPI user op: inoutbuf += inbuf, both float16 carried as 2-byte integers."""
    a = np.frombuffer(inbuf, dtype=np.float16)
    b = np.frombuffer(inoutbuf, dtype=np.float16)
    b += a


class MPICommAdapter:
    """Wraps an ``mpi4py.MPI.Comm`` as the ``ExchangeComm`` protocol."""

    def __init__(self, mpi_comm: object) -> None:
        from mpi4py import MPI  # noqa: PLC0415 - keep numpy-only imports cheap

        if not isinstance(mpi_comm, MPI.Comm):
            raise TypeError(f"expected an mpi4py.MPI.Comm, got {type(mpi_comm).__name__}")
        self._mpi = MPI
        self.comm = mpi_comm
        self.size = mpi_comm.Get_size()
        self.rank = mpi_comm.Get_rank()
        self._fp16_op = None

    def allreduce_sum(self, arr: object) -> object:
        host = np.ascontiguousarray(to_host(arr))
        out = np.empty_like(host)
        try:
            if host.dtype == np.float16:
                if self._fp16_op is None:
                    self._fp16_op = self._mpi.Op.Create(_fp16_sum, commute=True)
                u16 = self._mpi.UINT16_T
                self.comm.Allreduce(
                    [host.view(np.uint16), u16], [out.view(np.uint16), u16], op=self._fp16_op
                )
            else:
                self.comm.Allreduce(host, out, op=self._mpi.SUM)
        except self._mpi.Exception as exc:
            raise DLCommError(f"allreduce of {host.shape} {host.dtype} failed: {exc}") from exc
        return from_host(out, arr)

    def allgather(self, arr: object) -> list:
        host = np.ascontiguousarray(to_host(arr)).reshape(-1)
        try:
            counts = self.comm.allgather(host.nbytes)
            recv = np.empty(sum(counts), dtype=np.uint8)
            self.comm.Allgatherv(host.view(np.uint8), [recv, counts, self._mpi.BYTE])
        except self._mpi.Exception as exc:
            raise DLCommError(f"allgather of {host.size} {host.dtype} failed: {exc}") from exc
        bounds = np.cumsum([0, *counts])
        return [
            from_host(recv[lo:hi].view(host.dtype), arr) for lo, hi in zip(bounds, bounds[1:])
        ]

    def sendrecv(self, arr: object, peer: int) -> object:
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"peer must be another rank in [0, {self.size}), got {peer}")
        host = np.ascontiguousarray(to_host(arr)).reshape(-1)
        try:
            nbytes = self.comm.sendrecv(host.nbytes, dest=peer, source=peer)
            recv = np.empty(nbytes, dtype=np.uint8)
            self.comm.Sendrecv(
                [host.view(np.uint8), self._mpi.BYTE], dest=peer,
                recvbuf=[recv, self._mpi.BYTE], source=peer,
            )
        except self._mpi.Exception as exc:
            raise DLCommError(f"sendrecv with rank {peer} failed: {exc}") from exc
        return from_host(recv.view(host.dtype), arr)

    def free(self) -> None:
        """Release the user-defined MPI operation (call before MPI finalises, optional)."""
        if self._fp16_op is not None:
            self._fp16_op.Free()
            self._fp16_op = None
