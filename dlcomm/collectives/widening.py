"""16-bit buffers reduced in float32: the pieces of the hierarchical all-reduce's
"16 bits on the wire, 32-bit accumulation" path (the hybrid all-reduce of "ImageNet in four
minutes").

A ``Widening`` casts a 16-bit buffer (float16, or bfloat16 carried as uint16 bit patterns,
see ``dlcomm.bfloat16``) to float32 exactly and rounds float32 back to it once (nearest,
ties to even). ``widened_binomial_reduce`` reduces a host's buffers into a float32
accumulator on its leader; ``widened_ring_allreduce`` runs the ring among leaders with
16-bit messages but float32 additions. Summing in 16 bits rounds after every addition, so
its error grows with the number of ranks; here a partial sum is rounded only when it
crosses to another host (once per ring hop) and at the end.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from dlcomm import kernels
from dlcomm.collectives.buffers import PointToPoint
from dlcomm.collectives.chunking import displacements, equal_counts
from dlcomm.collectives.halving_doubling import (
    _doubling_allgather,
    _participant_rank,
    _world_rank,
    largest_power_of_two_at_most,
)
from dlcomm.collectives.reduction import reduce_into
from dlcomm.collectives.ring import ring_allgather_inplace
from dlcomm.collectives.tags import CollectiveTag

WIRE_DTYPES = (np.dtype(np.float16), np.dtype(np.uint16))


@dataclasses.dataclass(frozen=True)
class Widening:
    """Casts between a 16-bit wire dtype and float32: ``float16``, or ``uint16`` holding
    bfloat16 bit patterns (numpy has no bfloat16 dtype)."""

    wire: np.dtype

    def __post_init__(self) -> None:
        if np.dtype(self.wire) not in WIRE_DTYPES:
            raise TypeError(f"a widened reduction needs float16 or uint16 (bfloat16 bits), "
                            f"got {self.wire}")

    @property
    def bfloat16(self) -> bool:
        """True when the wire holds bfloat16 bit patterns."""
        return np.dtype(self.wire) == np.uint16

    def widen(self, src: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out`` (float32) = ``src`` (16-bit) exactly."""
        if self.bfloat16:
            return kernels.bf16_bits_to_float32(src, out=out)
        return kernels.float16_to_float32(src, out=out)

    def narrow(self, src: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out`` (16-bit) = ``src`` (float32) rounded to nearest, ties to even."""
        if self.bfloat16:
            return kernels.float32_to_bf16_bits(src, out=out)
        return kernels.float32_to_float16(src, out=out)


def _child_has_children(child: int, mask: int, size: int) -> bool:
    """Whether relative rank ``child`` (whose lowest set bit is ``mask``) receives from a
    child of its own in the binomial tree of ``size`` ranks before it sends."""
    return mask > 1 and child + 1 < size


def widened_binomial_reduce(
    comm: PointToPoint, data: np.ndarray, ufunc: np.ufunc, widening: Widening,
) -> np.ndarray | None:
    """Reduce every rank's 16-bit ``data`` in float32 along a binomial tree to rank 0.

    Returns the float32 result on rank 0, None on the other ranks. The tree of
    ``tree.binomial_reduce_inplace``: a rank that received nothing sends its own 16-bit
    ``data`` (exact: those are its inputs), a rank that did sends its float32 partial
    result, so no partial sum is rounded inside the host. Only ranks that receive hold a
    float32 copy of the buffer (and a float32 receive scratch). ``data`` is not modified.
    """
    size, rank = comm.size, comm.rank
    accumulator = wide = narrow = None  # allocated by the ranks that receive
    mask = 1
    while mask < size:
        if rank & mask:
            payload = data if accumulator is None else accumulator
            comm.send(payload, rank - mask, CollectiveTag.TREE_REDUCE)
            return None
        child = rank + mask
        if child < size:
            if accumulator is None:
                accumulator = widening.widen(data, np.empty(data.size, dtype=np.float32))
                wide = np.empty_like(accumulator)
            if _child_has_children(child, mask, size):
                comm.recv(wide, child, CollectiveTag.TREE_REDUCE)
            else:
                if narrow is None:
                    narrow = np.empty_like(data)
                comm.recv(narrow, child, CollectiveTag.TREE_REDUCE)
                widening.widen(narrow, wide)
            reduce_into(accumulator, wide, ufunc)
        mask <<= 1
    if accumulator is None:  # a communicator of one rank
        accumulator = widening.widen(data, np.empty(data.size, dtype=np.float32))
    return accumulator


def widened_ring_allreduce(
    comm: PointToPoint, accumulator: np.ndarray, out: np.ndarray, ufunc: np.ufunc,
    widening: Widening,
) -> None:
    """All-reduce the float32 ``accumulator`` over ``comm`` with 16-bit messages into ``out``.

    Ring reduce-scatter: at each step a rank rounds the block it passes on to 16 bits,
    and widens the block it receives and adds it into ``accumulator`` in float32. The
    finished block is rounded once into ``out``, and the ring all-gather circulates the
    16-bit blocks. Bytes on the wire: those of the 16-bit ring, ``2 (p-1)/p n``.
    ``accumulator`` is clobbered.
    """
    size, rank = comm.size, comm.rank
    offsets = displacements(equal_counts(accumulator.size, size))
    if size > 1:
        right, left = (rank + 1) % size, (rank - 1) % size
        largest = max(offsets[i + 1] - offsets[i] for i in range(size))
        outgoing = np.empty(largest, dtype=out.dtype)
        incoming = np.empty(largest, dtype=out.dtype)
        wide = np.empty(largest, dtype=np.float32)
        for step in range(size - 1):
            send_block = (rank - step - 1) % size
            recv_block = (rank - step - 2) % size
            s_lo, s_hi = offsets[send_block], offsets[send_block + 1]
            lo, hi = offsets[recv_block], offsets[recv_block + 1]
            widening.narrow(accumulator[s_lo:s_hi], outgoing[: s_hi - s_lo])
            comm.sendrecv_into(outgoing[: s_hi - s_lo], right, incoming[: hi - lo], left,
                               CollectiveTag.RING_REDUCE_SCATTER)
            widening.widen(incoming[: hi - lo], wide[: hi - lo])
            reduce_into(accumulator[lo:hi], wide[: hi - lo], ufunc)
    lo, hi = offsets[rank], offsets[rank + 1]
    widening.narrow(accumulator[lo:hi], out[lo:hi])
    ring_allgather_inplace(comm, out, offsets)


def widened_rhd_allreduce(
    comm: PointToPoint, accumulator: np.ndarray, out: np.ndarray, ufunc: np.ufunc,
    widening: Widening,
) -> None:
    """``widened_ring_allreduce`` by recursive halving-doubling (``halving_doubling``).

    Every message the reduction sends (the fold of the extra ranks, each halving step) is
    the float32 partial result rounded to 16 bits, and every received one is widened and
    added in float32; each rank rounds its finished block once into ``out``, and the
    doubling all-gather and the unfold move 16-bit results. ``log2 p`` roundings of a
    partial sum instead of the ring's ``p - 1``. ``accumulator`` is clobbered.
    """
    size, rank = comm.size, comm.rank
    if size == 1:
        widening.narrow(accumulator, out)
        return
    group = largest_power_of_two_at_most(size)
    extra = size - group
    me = _participant_rank(rank, extra)
    narrow = np.empty(accumulator.size, dtype=out.dtype)  # 16-bit send and receive scratch
    wide = np.empty_like(accumulator)
    if rank < 2 * extra:  # fold: the extra (even) ranks hand their sums to their partner
        if me < 0:
            widening.narrow(accumulator, narrow)
            comm.send(narrow, rank + 1, CollectiveTag.RHD_FOLD)
        else:
            comm.recv(narrow, rank - 1, CollectiveTag.RHD_FOLD)
            reduce_into(accumulator, widening.widen(narrow, wide), ufunc)
    if me >= 0:
        offsets = displacements(equal_counts(accumulator.size, group))
        incoming = np.empty_like(narrow)
        distance = group // 2
        while distance >= 1:  # recursive halving: keep the half holding block `me`
            partner = _world_rank(me ^ distance, extra)
            keep_lo = offsets[(me // distance) * distance]
            keep_hi = offsets[(me // distance) * distance + distance]
            give_lo = offsets[((me ^ distance) // distance) * distance]
            give_hi = offsets[((me ^ distance) // distance) * distance + distance]
            n_give, n_keep = give_hi - give_lo, keep_hi - keep_lo
            widening.narrow(accumulator[give_lo:give_hi], narrow[:n_give])
            comm.sendrecv_into(narrow[:n_give], partner, incoming[:n_keep], partner,
                               CollectiveTag.RHD_REDUCE_SCATTER)
            widening.widen(incoming[:n_keep], wide[:n_keep])
            reduce_into(accumulator[keep_lo:keep_hi], wide[:n_keep], ufunc)
            distance //= 2
        lo, hi = offsets[me], offsets[me + 1]
        widening.narrow(accumulator[lo:hi], out[lo:hi])
        _doubling_allgather(comm, out, offsets, me, group, extra)
    if rank < 2 * extra:  # unfold: the partners hand the 16-bit result back
        if me < 0:
            comm.recv(out, rank + 1, CollectiveTag.RHD_UNFOLD)
        else:
            comm.send(out, rank - 1, CollectiveTag.RHD_UNFOLD)
