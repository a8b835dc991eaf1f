"""The communicator protocol the engine talks to; MPI and NCCL backends implement it.

Buffers are 1-D contiguous arrays (numpy for MPI, CuPy for NCCL); counts are in elements.
Only the engine's background thread calls these methods.
"""
from __future__ import annotations

from typing import Any, Protocol

from dlcomm.ops import ReduceOp


class PendingRequest(Protocol):
    """A non-blocking operation: ``test()`` is True once it completed."""

    def test(self) -> bool: ...


class Communicator(Protocol):
    """Collectives over a fixed group of processes."""

    rank: int
    size: int

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: ReduceOp) -> None:
        """Reduce ``sendbuf`` of every rank into ``recvbuf`` (``sendbuf is recvbuf``: in place)."""

    def allgatherv(self, sendbuf: Any, recvbuf: Any, counts: list[int]) -> None:
        """Concatenate every rank's ``sendbuf`` (rank i sends ``counts[i]``) into ``recvbuf``."""

    def bcast(self, buf: Any, root: int) -> None:
        """Copy ``buf`` of ``root`` into ``buf`` of every rank."""

    def alltoallv(self, sendbuf: Any, sendcounts: list[int], recvbuf: Any,
                  recvcounts: list[int]) -> None:
        """Rank i sends its j-th slice (``sendcounts[j]``) to rank j."""

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: list[int],
                       op: ReduceOp) -> None:
        """Reduce, then rank i keeps the i-th slice (``counts[i]`` elements)."""
