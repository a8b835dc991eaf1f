"""The transport's communicator: what the layers above ask of MPI (``mpi_backend``) or NCCL.

Buffers are 1-D contiguous arrays (numpy for MPI, CuPy for NCCL); counts are in elements.
Three groups of users, three groups of methods:

* the engine (``Communicator``): the collectives it executes, in place on given buffers;
* compressed exchange (``ExchangeComm`` in ``dlcomm.compression``): ``allreduce_sum``,
  ``allgather`` and ``sendrecv`` on arrays of any size, returning new arrays;
* collective algorithms and heterogeneity algorithms (``PointToPoint``): blocking and
  non-blocking messages into given buffers (waited on one by one or together), a
  non-blocking barrier, and sub-communicators.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from dlcomm.ops import ReduceOp


class PendingRequest(Protocol):
    """A non-blocking operation: ``test()`` is True once it completed."""

    def test(self) -> bool: ...


class PendingRequests(Protocol):
    """Non-blocking operations waited on together (``PointToPoint.request_list``)."""

    pending: int

    def add(self, request: PendingRequest, key: Any) -> None:
        """Include ``request`` (from ``isend``/``irecv``), reported by ``key``."""

    def wait_some(self) -> list[Any]:
        """Block until at least one request completes; return the keys of those that did."""


class Communicator(Protocol):
    """Collectives over a fixed group of processes (what the engine executes)."""

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


class PointToPoint(Protocol):
    """Messages between two ranks and sub-communicators (MPI backend only)."""

    rank: int
    size: int

    def send(self, buf: Any, dest: int, tag: int) -> None:
        """Send the bytes of ``buf`` to ``dest`` (blocking)."""

    def recv(self, buf: Any, source: int, tag: int) -> None:
        """Receive ``buf.nbytes`` bytes from ``source`` into ``buf`` (blocking)."""

    def sendrecv_into(self, sendbuf: Any, dest: int, recvbuf: Any, source: int,
                      tag: int) -> None:
        """Send ``sendbuf`` to ``dest`` while receiving ``recvbuf`` from ``source``."""

    def isend(self, buf: Any, dest: int, tag: int) -> PendingRequest:
        """Start sending ``buf`` to ``dest``."""

    def irecv(self, buf: Any, source: int, tag: int) -> PendingRequest:
        """Start receiving into ``buf`` from ``source``."""

    def request_list(self) -> PendingRequests:
        """An empty set of requests to wait on together."""

    def test_all(self, requests: Sequence[PendingRequest]) -> bool:
        """True once every one of ``requests`` completed."""

    def ibarrier(self) -> PendingRequest:
        """Start a barrier over every rank."""

    def barrier(self) -> None:
        """Return once every rank entered the barrier."""

    def allgather(self, value: Any) -> list:
        """Every rank's ``value`` (an array, or any picklable value), in rank order."""

    def split(self, color: int | None, key: int) -> Any:
        """The ranks that passed the same ``color`` (``None``: no communicator)."""

    def dup(self) -> Any:
        """A communicator over the same ranks whose messages never meet this one's."""

    def free(self) -> None:
        """Release the communicator (collective)."""
