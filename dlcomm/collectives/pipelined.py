"""The ``pipelined`` all-reduce: ``ordered``'s bits, with sending, receiving and reducing
overlapped segment by segment.

Like ``ordered``, rank r owns block r of the buffer (``equal_counts``), receives every rank's
copy of it, reduces the copies in rank order (``((x_0 op x_1) op x_2) ... op x_{p-1}`` for
every element) and sends the result to every rank: the bytes of a ring, ``2 (p-1)/p n`` per
rank each way. Here each block is cut into segments of ``segment_bytes`` that travel as
non-blocking point-to-point messages in steps: at step s every rank sends to rank + s and
receives from rank - s (a shifted ring, so each link carries one flow each way, never the
many-to-one bursts of an all-to-all), with the next message always queued behind the one on
the wire. Segment k of a block is reduced as soon as its last copy arrives and its result
leaves at once, while later segments are still travelling: the link of every rank stays busy
from the first byte to the last, instead of idling between an all-to-all, a reduction and an
all-gather. The reduction is
``ordered``'s own function on the same copies, so the result is bit for bit ``ordered``'s for
every segment size, buffer size and rank count, and the choice between the two (``auto``)
never changes a model.
"""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping

import numpy as np

from dlcomm.collectives.buffers import (
    CommLike,
    check_comm,
    check_send_recv_pair,
    is_same_buffer,
    raise_collective_errors,
)
from dlcomm.collectives.chunking import displacements, equal_counts
from dlcomm.collectives.reduction import reduction_ufunc
from dlcomm.collectives.tags import CollectiveTag
from dlcomm.comm.rank_order import reduce_in_rank_order
from dlcomm.config import parse_bytes
from dlcomm.ops import ReduceOp

DEFAULT_SEGMENT_BYTES = 1 << 20
SEGMENT_BYTES_ENV = "DLCOMM_ALLREDUCE_SEGMENT_BYTES"
# Segments per block at most: a larger block gets larger segments, which bounds the
# messages and the bookkeeping per byte.
MAX_SEGMENTS = 32
# Sends in flight per phase: one on the wire and one queued behind it.
WINDOW = 2

_RS_RECV, _RS_SEND, _AG_RECV, _AG_SEND = range(4)


def check_segment_bytes(segment_bytes: object) -> int:
    """Require a positive whole number of bytes."""
    if (isinstance(segment_bytes, bool) or not isinstance(segment_bytes, (int, np.integer))
            or segment_bytes < 1):
        raise ValueError(f"segment_bytes must be a positive int, got {segment_bytes!r}")
    return int(segment_bytes)


def segment_bytes_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``DLCOMM_ALLREDUCE_SEGMENT_BYTES`` (suffixes k, M allowed; default 1 MiB)."""
    environ = os.environ if environ is None else environ
    text = environ.get(SEGMENT_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_SEGMENT_BYTES
    try:
        return check_segment_bytes(parse_bytes(text))
    except ValueError as exc:
        raise ValueError(f"{SEGMENT_BYTES_ENV}={text!r}: {exc}") from None


def segment_bounds(count: int, segment: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each segment of a block of ``count`` elements, ``segment`` at most
    each (none for an empty block)."""
    return [(lo, min(lo + segment, count)) for lo in range(0, count, segment)]


@raise_collective_errors
def pipelined_allreduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
    *,
    allreduce_segment_bytes: int | None = None,
) -> np.ndarray:
    """All-reduce ``sendbuf`` into ``recvbuf`` with ``ordered``'s result, segments pipelined.

    Buffers are contiguous 1-D numpy arrays of the same size and dtype on every rank;
    ``sendbuf is recvbuf`` reduces in place. ``allreduce_segment_bytes`` (the same on every rank;
    None: ``DLCOMM_ALLREDUCE_SEGMENT_BYTES``, default 1 MiB) is the largest message, raised
    where needed so that no block has more than ``MAX_SEGMENTS`` segments; scratch memory is
    one block of every rank (``n`` elements in all).
    Returns ``recvbuf``.
    """
    comm = check_comm(comm)
    ufunc = reduction_ufunc(op)
    segment_bytes = (segment_bytes_from_env() if allreduce_segment_bytes is None
                     else check_segment_bytes(allreduce_segment_bytes))
    send, recv = check_send_recv_pair(sendbuf, recvbuf)
    size, rank = comm.size, comm.rank
    if size == 1 or recv.size == 0:
        if not is_same_buffer(send, recv):
            np.copyto(recv, send)
        return recv
    offsets = displacements(equal_counts(send.size, size))
    largest = offsets[1] - offsets[0]  # equal_counts puts the largest block first
    segment = max(1, segment_bytes // send.itemsize, -(-largest // MAX_SEGMENTS))
    blocks = [segment_bounds(offsets[j + 1] - offsets[j], segment) for j in range(size)]
    own = blocks[rank]
    # Step s pairs this rank with rank + s (sending) and rank - s (receiving): every rank
    # talks to one peer each way at a time, as in a ring, with no many-to-one bursts.
    order = [(rank + step) % size for step in range(1, size)]
    # copies[j]: rank j's copy of block `rank`; this rank's own copy is taken before the
    # result (which, in place, overwrites it) is written.
    mine = offsets[rank + 1] - offsets[rank]
    copies = np.empty((size, mine), dtype=send.dtype)
    np.copyto(copies[rank], send[offsets[rank]:offsets[rank + 1]])
    result = recv[offsets[rank]:offsets[rank + 1]]
    requests = comm.request_list()
    # Every receive of a copy is posted first, so no copy waits for its buffer.
    for k, (lo, hi) in enumerate(own):
        for j in order:
            requests.add(comm.irecv(copies[j, lo:hi], j, CollectiveTag.PIPELINED_SCATTER + k),
                         (_RS_RECV, j, k))
    # Sends leave in step order, WINDOW at a time per phase: the next is queued while one
    # is on the wire, so the link never idles and never carries more flows than it must.
    scatter = deque((j, k) for j in order for k in range(len(blocks[j])))
    gather = deque((j, k) for j in order for k in range(len(own)))
    reduced = [False] * len(own)
    arrived = [0] * len(own)
    flying = [0, 0]  # sends in flight: scatter, gather

    def post_sends() -> None:
        while scatter and flying[0] < WINDOW:
            j, k = scatter.popleft()
            lo, hi = blocks[j][k]
            base = offsets[j]
            requests.add(comm.isend(send[base + lo:base + hi], j,
                                    CollectiveTag.PIPELINED_SCATTER + k), (_RS_SEND, j, k))
            flying[0] += 1
        while gather and flying[1] < WINDOW and reduced[gather[0][1]]:
            j, k = gather.popleft()
            lo, hi = own[k]
            requests.add(comm.isend(result[lo:hi], j, CollectiveTag.PIPELINED_GATHER + k),
                         (_AG_SEND, j, k))
            flying[1] += 1

    post_sends()
    while requests.pending:
        for kind, j, k in requests.wait_some():
            if kind == _RS_RECV:
                arrived[k] += 1
                if arrived[k] == size - 1:
                    lo, hi = own[k]
                    reduce_in_rank_order(copies[:, lo:hi], result[lo:hi], ufunc)
                    reduced[k] = True
            elif kind == _RS_SEND:
                flying[0] -= 1
                # Only now may block j's segment k be overwritten by the result: in place it
                # is the memory that was just sent.
                lo, hi = blocks[j][k]
                base = offsets[j]
                requests.add(comm.irecv(recv[base + lo:base + hi], j,
                                        CollectiveTag.PIPELINED_GATHER + k), (_AG_RECV, j, k))
            elif kind == _AG_SEND:
                flying[1] -= 1
        post_sends()
    return recv
