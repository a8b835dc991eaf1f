"""DLCP-style bounded-loss gradient exchange (``loss_tolerance=p``).

The flat gradient is cut into chunks at tensor boundaries, shard boundaries and every
``chunk_elems`` elements. Rank ``r`` owns shard ``r`` and averages it (a reduce-scatter),
then the averaged shards are all-gathered losslessly. A sender marks as *droppable* its
lowest-priority outgoing chunks, at most a fraction ``p`` of the elements it sends;
priority grows with magnitude and with nearness to the input (front layers are needed
first). Protected tensors (biases, norms: 1-D; and tensors smaller than
``min_size``) are never droppable. Chunks travel in priority order, spread over
``channels`` duplicated communicators. An owner waits for every mandatory chunk, then for
droppable ones until a deadline learned from recent exchanges; each element is averaged over
the contributions that arrived. Receives that missed the deadline stay posted and are
drained (completed, data discarded) at the start of the next exchange or by ``drain()``:
every send is matched by exactly one receive. What a sender's owner did not count goes back
into the sender's residual (error feedback: ``sent + residual == gradient + old residual``).
With ``p = 0`` nothing is droppable and the result is a plain averaging all-reduce.

This module exchanges non-blocking point-to-point messages on communicators of its own
(duplicates of the world, from the transport ``dlcomm.comm``) rather than through the engine,
whose requests are collectives negotiated over every rank.
"""
from __future__ import annotations

import dataclasses
import numbers
import time
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from dlcomm.comm.polling import wait_polling
from dlcomm.heterogeneity.agreement import check_same_settings
from dlcomm.heterogeneity.world_comm import base_comm

HEADER_TAG = 0


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One contiguous piece of the flat gradient: ``[start, end)`` of tensor ``layer``."""

    start: int
    end: int
    owner: int
    layer: int
    protected: bool

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclasses.dataclass
class ExchangeStats:
    """What one exchange did: elements not counted, pending receives left to drain, times."""

    lost_elements: int
    total_elements: int  # contributions: flat length x ranks
    pending: int
    mandatory_s: float
    total_s: float
    deadline_s: float

    @property
    def lost_fraction(self) -> float:
        return self.lost_elements / max(self.total_elements, 1)


def plan_chunks(sizes: Sequence[int], protected: Sequence[bool], num_ranks: int,
                chunk_elems: int) -> list[Chunk]:
    """Cut a flat buffer of tensors (``sizes``, input layer first) into owned chunks.

    Shard ``r`` is the ``r``-th of ``num_ranks`` near-equal contiguous pieces of the buffer.
    """
    if len(sizes) != len(protected) or not sizes:
        raise ValueError("sizes and protected must be non-empty and of equal length")
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1 for s in sizes):
        raise ValueError(f"tensor sizes must be positive ints, got {list(sizes)}")
    if num_ranks < 1 or chunk_elems < 1:
        raise ValueError("num_ranks and chunk_elems must be >= 1")
    total = int(sum(sizes))
    shard_bounds = [total * r // num_ranks for r in range(num_ranks + 1)]
    chunks: list[Chunk] = []
    pos = 0
    for layer, (n, prot) in enumerate(zip(sizes, protected)):
        end_t = pos + int(n)
        while pos < end_t:
            owner = next(r for r in range(num_ranks) if shard_bounds[r + 1] > pos)
            end = min(end_t, pos + chunk_elems, shard_bounds[owner + 1])
            chunks.append(Chunk(pos, end, owner, layer, bool(prot)))
            pos = end
    return chunks


def layout_fingerprint(sizes: Sequence[int], protected: Sequence[bool]) -> dict[str, Any]:
    """Tensors, elements and a checksum of (size, protected) per tensor: compared across
    ranks without sending every size. Never raises (it runs before a collective check, so
    a bad argument on one rank must not leave the others waiting): input it cannot read is
    described instead and refused after the check."""
    try:
        pairs = np.array([[int(n), bool(p)] for n, p in zip(sizes, protected)],
                         dtype=np.int64).reshape(-1, 2)
        return {"tensors": len(sizes), "protected flags": len(protected),
                "elements": int(pairs[:, 0].sum()), "layout checksum": zlib.crc32(pairs.tobytes())}
    except (TypeError, ValueError, OverflowError):
        return {"layout": f"unreadable sizes/protected: {str(sizes)[:60]}"}


def chunk_priority(chunks: Sequence[Chunk], magnitudes: np.ndarray,
                   num_layers: int) -> np.ndarray:
    """Priority of each chunk: mean |value| x (2 - depth), depth in [0, 1] from input to
    output layer (front layers are needed first)."""
    depth = np.array([c.layer / max(num_layers - 1, 1) for c in chunks], dtype=np.float64)
    return np.asarray(magnitudes, dtype=np.float64) * (2.0 - depth)


def droppable_mask(chunks: Sequence[Chunk], magnitudes: np.ndarray, num_layers: int,
                   loss_tolerance: float) -> np.ndarray:
    """Which of ``chunks`` may be dropped: the lowest-priority (``chunk_priority``)
    unprotected ones, at most ``loss_tolerance`` of their elements in all."""
    mask = np.zeros(len(chunks), dtype=bool)
    budget = int(np.floor(loss_tolerance * sum(c.size for c in chunks)))
    if budget <= 0:
        return mask
    score = chunk_priority(chunks, magnitudes, num_layers)
    for i in np.argsort(score, kind="stable"):
        c = chunks[i]
        if c.protected or c.size > budget:
            continue
        mask[i] = True
        budget -= c.size
    return mask


class BoundedLossExchange:
    """Averages a flat float32 gradient over all ranks, losing at most ``loss_tolerance`` of
    the elements per step. Construction is collective (it duplicates the communicator)."""

    def __init__(self, sizes: Sequence[int], protected: Sequence[bool],
                 loss_tolerance: float, *, chunk_elems: int = 1024, channels: int = 4,
                 warmup: int = 3, window: int = 20, slack: float = 1.2,
                 deadline_s: float | None = None, comm: Any = None) -> None:
        if isinstance(loss_tolerance, bool) or not isinstance(loss_tolerance, numbers.Real):
            raise TypeError(f"loss_tolerance must be a float, got {type(loss_tolerance).__name__}")
        if not 0.0 <= loss_tolerance < 1.0:
            raise ValueError(f"loss_tolerance must be in [0, 1), got {loss_tolerance}")
        for what, v in (("chunk_elems", chunk_elems), ("channels", channels),
                        ("window", window)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{what} must be an int >= 1, got {v!r}")
        if deadline_s is not None and deadline_s < 0:
            raise ValueError(f"deadline_s must be >= 0 or None, got {deadline_s}")
        base = base_comm(comm)
        check_same_settings(base, "DLCP's BoundedLossExchange", {
            "loss_tolerance": float(loss_tolerance), "chunk_elems": int(chunk_elems),
            "channels": int(channels), **layout_fingerprint(sizes, protected)})
        self.comms = [base.dup() for _ in range(int(channels))]
        self.rank, self.size = base.rank, base.size
        self.p = float(loss_tolerance)
        self.num_layers = len(sizes)
        self.chunks = plan_chunks(sizes, protected, self.size, int(chunk_elems))
        self.length = int(sum(sizes))
        self.by_owner = [[c for c in self.chunks if c.owner == r] for r in range(self.size)]
        self.shard = (self.by_owner[self.rank][0].start if self.by_owner[self.rank] else 0,
                      self.by_owner[self.rank][-1].end if self.by_owner[self.rank] else 0)
        self.shard_bounds = [(cs[0].start, cs[-1].end) if cs else (0, 0)
                             for cs in self.by_owner]
        self.warmup, self.window, self.slack = int(warmup), int(window), float(slack)
        self.fixed_deadline = deadline_s
        self.residual = np.zeros(self.length, dtype=np.float32)
        self._history: list[float] = []
        self._exchanges = 0
        self._late: list[Any] = []  # receives past their deadline, still posted
        self._sends: list[Any] = []  # previous exchange's sends and their buffers
        self._send_bufs: list[np.ndarray] = []
        self._late_bufs: list[np.ndarray] = []
        self._hold_droppable = False  # tests only: send droppable chunks after the decision

    # --- deadline learned from recent exchanges ------------------------------------------
    def deadline(self) -> float:
        """Seconds after the start of an exchange at which droppable chunks stop counting."""
        if self.fixed_deadline is not None:
            return self.fixed_deadline
        if self.p == 0.0 or self._exchanges < self.warmup or not self._history:
            return float("inf")
        return self.slack * float(np.median(self._history[-self.window:]))

    # --- the exchange ----------------------------------------------------------------------
    def pending_requests(self) -> int:
        """Receives and sends of earlier exchanges not yet completed."""
        return len(self._late) + len(self._sends)

    def drain(self) -> None:
        """Complete every late receive (discarding its data) and every earlier send."""
        for reqs in (self._late, self._sends):
            if reqs:
                wait_polling(lambda reqs=reqs: self.comms[0].test_all(reqs))
        self._late, self._late_bufs = [], []
        self._sends, self._send_bufs = [], []

    def close(self) -> None:
        """Drain, then free the communicators (collective)."""
        self.drain()
        for c in self.comms:
            c.free()
        self.comms = []

    def _comm(self, index: int) -> Any:
        return self.comms[index % len(self.comms)]

    def _pieces(self, mandatory: Sequence[int]) -> list[list[int]]:
        """Mandatory chunk indices (ascending: input layer first) cut into at most
        ``channels`` consecutive pieces, one message each; sender and owner cut alike."""
        n = min(len(self.comms), len(mandatory))
        if n == 0:
            return []
        return [part.tolist() for part in np.array_split(np.asarray(mandatory, int), n)]

    def _tag(self, chunk: int) -> int:
        """Tag of droppable chunk ``chunk``: after the header (0) and the pieces."""
        return 1 + len(self.comms) + chunk

    def exchange(self, flat: np.ndarray) -> tuple[np.ndarray, ExchangeStats]:
        """Average ``flat`` (float32, 1-D, the same layout on every rank) over all ranks.

        Returns the averaged buffer (a new array) and this exchange's statistics.
        Collective: every rank calls it with its own gradient.

        Per owner, a sender sends a header (which chunks are mandatory), its mandatory
        chunks packed into at most ``channels`` messages (one per channel, input layers
        first), then each droppable chunk as a message of its own, highest priority first,
        so an owner can stop waiting for any of them.
        """
        if not isinstance(flat, np.ndarray) or flat.dtype != np.float32 or flat.ndim != 1:
            raise TypeError("flat must be a 1-D float32 numpy array")
        if flat.size != self.length:
            raise ValueError(f"flat has {flat.size} elements; the plan has {self.length}")
        if not self.comms:
            raise RuntimeError("this exchange was closed")
        self.drain()
        t0 = time.perf_counter()
        acc = flat + self.residual
        me = self.rank
        mine = self.by_owner[me]
        senders = [s for s in range(self.size) if s != me]
        headers = {s: np.empty(len(mine), dtype=np.uint8) for s in senders}
        header_reqs = [self.comms[0].irecv(headers[s], s, HEADER_TAG)
                       for s in senders]
        # Send to every owner: header (1 = mandatory), packed mandatory pieces, droppables.
        sends: list[Any] = []
        held: list[tuple[int, int, np.ndarray]] = []
        bufs: list[np.ndarray] = []
        owners = [o for o in range(self.size) if o != me and self.by_owner[o]]
        out_chunks = [c for o in owners for c in self.by_owner[o]]
        starts = np.array([c.start for c in out_chunks], dtype=np.int64)
        ends = np.array([c.end for c in out_chunks], dtype=np.int64)
        prefix = np.concatenate([[0.0], np.cumsum(np.abs(acc), dtype=np.float64)])
        out_mags = (prefix[ends] - prefix[starts]) / np.maximum(ends - starts, 1)
        # One budget over everything this rank sends: at most p of its elements.
        out_drop = droppable_mask(out_chunks, out_mags, self.num_layers, self.p)
        out_priority = chunk_priority(out_chunks, out_mags, self.num_layers)
        pos = 0
        for o in owners:
            cs = self.by_owner[o]
            priority, drop = out_priority[pos:pos + len(cs)], out_drop[pos:pos + len(cs)]
            pos += len(cs)
            header = (~drop).astype(np.uint8)
            bufs.append(header)
            sends.append(self.comms[0].isend(header, o, HEADER_TAG))
            for j, piece in enumerate(self._pieces(np.flatnonzero(~drop))):
                data = np.concatenate([acc[cs[i].start:cs[i].end] for i in piece])
                bufs.append(data)
                sends.append(self.comms[j].isend(data, o, 1 + j))
            for i in sorted(np.flatnonzero(drop).tolist(), key=lambda i: -priority[i]):
                data = np.ascontiguousarray(acc[cs[i].start:cs[i].end])
                bufs.append(data)
                if self._hold_droppable:
                    held.append((o, i, data))
                else:
                    sends.append(self._comm(i).isend(data, o, self._tag(i)))
        # Polled, not Waitall: a rank waiting for peers still in backward must not spin
        # (ranks can outnumber cores); see dlcomm/comm/polling.py.
        wait_polling(lambda: self.comms[0].test_all(header_reqs))
        piece_bufs: dict[int, list[tuple[list[int], np.ndarray]]] = {}
        mandatory: list[Any] = []
        optional: list[tuple[int, int, Any, np.ndarray]] = []
        for s in senders:
            piece_bufs[s] = []
            for j, piece in enumerate(self._pieces(np.flatnonzero(headers[s]))):
                buf = np.empty(sum(mine[i].size for i in piece), dtype=np.float32)
                piece_bufs[s].append((piece, buf))
                mandatory.append(self.comms[j].irecv(buf, s, 1 + j))
            for i in np.flatnonzero(headers[s] == 0).tolist():
                buf = np.empty(mine[i].size, dtype=np.float32)
                optional.append((s, i, self._comm(i).irecv(buf, s, self._tag(i)),
                                 buf))
        if mandatory:
            wait_polling(lambda: self.comms[0].test_all(mandatory))
        t_mand = time.perf_counter() - t0
        deadline = max(self.deadline(), t_mand)
        arrived = np.zeros(len(optional), dtype=bool)
        while not arrived.all():
            for k, (_, _, req, _) in enumerate(optional):
                if not arrived[k] and req.test():
                    arrived[k] = True
            if arrived.all() or time.perf_counter() - t0 >= deadline:
                break
            time.sleep(5e-5)
        t_all = time.perf_counter() - t0
        if arrived.all():  # learn the deadline from complete exchanges only
            self._history.append(t_all if optional else t_mand)
        # Average each element of my shard over the contributions that arrived.
        lo, hi = self.shard
        total = acc[lo:hi].astype(np.float32, copy=True)
        count = np.ones(hi - lo, dtype=np.float32)
        arrival = np.ones((self.size, len(mine)), dtype=np.uint8)
        for s in senders:
            for piece, buf in piece_bufs[s]:
                at = 0
                for i in piece:
                    c = mine[i]
                    total[c.start - lo:c.end - lo] += buf[at:at + c.size]
                    count[c.start - lo:c.end - lo] += 1
                    at += c.size
        for k, (s, i, req, buf) in enumerate(optional):
            c = mine[i]
            if arrived[k]:
                total[c.start - lo:c.end - lo] += buf
                count[c.start - lo:c.end - lo] += 1
            else:  # late: keep it posted, drain next time
                arrival[s, i] = 0
                self._late.append(req)
                self._late_bufs.append(buf)
        total /= count
        # One lossless all-gather: the averaged shards and who arrived where (as float32).
        out_all = np.empty(self.length + self.size * len(self.chunks), dtype=np.float32)
        counts = [(b - a) + self.size * len(cs)
                  for (a, b), cs in zip(self.shard_bounds, self.by_owner)]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        mine_out = np.concatenate([total, arrival.reshape(-1).astype(np.float32)])
        self.comms[0].allgatherv(mine_out, out_all, counts)
        out = np.empty(self.length, dtype=np.float32)
        # Every rank has decided once the all-gather completed: held chunks are now late.
        for o, i, data in held:
            sends.append(self._comm(i).isend(data, o, self._tag(i)))
        # Error feedback: what my owners did not count stays in my residual.
        self.residual[:] = 0.0
        lost = 0
        for o, ((a, b), cs) in enumerate(zip(self.shard_bounds, self.by_owner)):
            at = displs[o]
            out[a:b] = out_all[at:at + b - a]
            matrix = out_all[at + b - a:at + counts[o]].reshape(self.size, len(cs)) != 0
            sizes = np.array([c.size for c in cs], dtype=np.int64)
            lost += int(((~matrix) * sizes).sum())
            if o == me:
                continue
            for i in np.flatnonzero(~matrix[me]).tolist():
                self.residual[cs[i].start:cs[i].end] = acc[cs[i].start:cs[i].end]
        self._sends, self._send_bufs = sends, bufs
        self._exchanges += 1
        stats = ExchangeStats(lost, self.length * self.size, self.pending_requests(),
                              t_mand, t_all, deadline)
        return out, stats
