"""Byte counting as a communicator wrapper: what ``dlcomm.bytes_sent()`` reports.

``CountingCommunicator`` passes every call to the communicator it wraps and adds the payload
bytes this rank contributes (the send buffer; a broadcast's buffer on its root only; a
point-to-point message's buffer) to a ``ByteCounter`` shared by all of a job's wrappers (or
its own: split fine-tuning's link counts the bytes across the split apart). Negotiation
messages are not payload and go through unwrapped communicators.
"""
from __future__ import annotations

from typing import Any

from dlcomm.ops import ReduceOp


class ByteCounter:
    """Payload bytes this rank has sent since ``init()``."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


class CountingCommunicator:
    """``inner`` (any transport communicator), counting the payload bytes sent through it."""

    def __init__(self, inner: Any, counter: ByteCounter) -> None:
        self.inner = inner
        self.counter = counter
        self.rank = inner.rank
        self.size = inner.size

    def __getattr__(self, name: str) -> Any:  # everything that moves no payload
        return getattr(self.inner, name)

    # --- the engine's collectives ----------------------------------------------------------
    def allreduce(self, sendbuf: Any, recvbuf: Any, op: ReduceOp) -> None:
        self.inner.allreduce(sendbuf, recvbuf, op)
        self.counter.total += sendbuf.nbytes

    def allgatherv(self, sendbuf: Any, recvbuf: Any, counts: list[int]) -> None:
        self.inner.allgatherv(sendbuf, recvbuf, counts)
        self.counter.total += sendbuf.nbytes

    def bcast(self, buf: Any, root: int) -> None:
        self.inner.bcast(buf, root)
        if self.rank == root:
            self.counter.total += buf.nbytes

    def alltoallv(self, sendbuf: Any, sendcounts: list[int], recvbuf: Any,
                  recvcounts: list[int]) -> None:
        self.inner.alltoallv(sendbuf, sendcounts, recvbuf, recvcounts)
        self.counter.total += sendbuf.nbytes

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, counts: list[int],
                       op: ReduceOp) -> None:
        self.inner.reduce_scatter(sendbuf, recvbuf, counts, op)
        self.counter.total += sendbuf.nbytes

    # --- compressed exchange's rounds --------------------------------------------------------
    def allreduce_sum(self, arr: Any) -> Any:
        self.counter.total += arr.nbytes
        return self.inner.allreduce_sum(arr)

    def allgather(self, value: Any) -> list:
        self.counter.total += getattr(value, "nbytes", 0)
        return self.inner.allgather(value)

    def sendrecv(self, arr: Any, peer: int) -> Any:
        self.counter.total += arr.nbytes
        return self.inner.sendrecv(arr, peer)

    # --- point-to-point (split fine-tuning's link) -------------------------------------------
    def send(self, buf: Any, dest: int, tag: int) -> None:
        self.inner.send(buf, dest, tag)
        self.counter.total += buf.nbytes

    def isend(self, buf: Any, dest: int, tag: int) -> Any:
        request = self.inner.isend(buf, dest, tag)
        self.counter.total += buf.nbytes
        return request

    def sendrecv_into(self, sendbuf: Any, dest: int, recvbuf: Any, source: int,
                      tag: int) -> None:
        self.inner.sendrecv_into(sendbuf, dest, recvbuf, source, tag)
        self.counter.total += sendbuf.nbytes
