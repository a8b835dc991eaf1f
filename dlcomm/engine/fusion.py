"""Tensor fusion: pack many small all-reduces into one buffer, send one message, unpack.

``plan_fusion`` decides which ready requests travel together (same key, up to the
threshold, in the global order); ``FusionBuffer`` keeps one growable buffer per dtype so
steady-state training allocates nothing.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.kernels import scale_into


def plan_fusion(nbytes: Sequence[int], keys: Sequence[Hashable], threshold: int) -> list[list[int]]:
    """Group indices by key, in order, so no group exceeds ``threshold`` bytes.

    A request larger than the threshold travels alone. Groups are returned in the order of
    their first member, so every rank that plans the same list gets the same groups.
    """
    if len(nbytes) != len(keys):
        raise ValueError("nbytes and keys must have the same length")
    if threshold < 0:
        raise ValueError(f"fusion threshold must be >= 0, got {threshold}")
    groups: list[list[int]] = []
    open_group: dict[Hashable, tuple[int, int]] = {}  # key -> (group index, bytes so far)
    for i, (size, key) in enumerate(zip(nbytes, keys)):
        current = open_group.get(key)
        if current is not None and current[1] + size <= threshold:
            groups[current[0]].append(i)
            open_group[key] = (current[0], current[1] + size)
        else:
            groups.append([i])
            open_group[key] = (len(groups) - 1, size)
    return groups


def allreduce_groups(responses: Sequence[Any], threshold: int) -> list[list[int]]:
    """Which of a cycle's ready all-reduce ``responses`` travel together: same process set,
    dtype, wire op, compression and joined ranks, dense ones up to ``threshold`` bytes.

    Compressed requests are grouped regardless of size: their payloads, not their tensors,
    fill fusion buffers (thresholds scale with the compression).
    """
    keys, nbytes = [], []
    for resp in responses:
        derived = resp.derived.get("fusion")
        if derived is None:  # once per response: cached responses run every step
            sig = resp.reference
            wire_op = "sum" if sig.op == "average" else sig.op
            derived = resp.derived["fusion"] = (
                (sig.process_set_id, sig.dtype, wire_op, sig.compression,
                 tuple(sorted(resp.joined))),
                0 if sig.compression != "none" else
                sum(math.prod(s) for s in sig.shapes) * np.dtype(sig.dtype).itemsize)
        keys.append(derived[0])
        nbytes.append(derived[1])
    return plan_fusion(nbytes, keys, threshold)


# A bucket is sent once its start-up cost is at most this share of its time on the wire.
BUCKET_STARTUP_SHARE = 0.1
MIN_BUCKET_BYTES = 64 << 10


def bucket_bytes(alpha: float, beta: float, threshold: int,
                 startup_share: float = BUCKET_STARTUP_SHARE) -> int:
    """Bytes worth sending as soon as they are queued, from an all-reduce costing
    ``alpha + beta n`` seconds: the smallest n whose start-up ``alpha`` is at most
    ``startup_share`` of the whole, between ``MIN_BUCKET_BYTES`` and ``threshold``.

    Waiting for more gradients than that only delays the first message of a backward pass;
    sending less pays start-up costs that more gradients would have shared."""
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got {alpha}, {beta}")
    if not 0 < startup_share < 1:
        raise ValueError(f"startup_share must be in (0, 1), got {startup_share}")
    if beta == 0:
        return max(threshold, MIN_BUCKET_BYTES)
    wanted = alpha * (1 - startup_share) / (startup_share * beta)
    return int(min(max(wanted, MIN_BUCKET_BYTES), max(threshold, MIN_BUCKET_BYTES)))


class FusionBuffer:
    """One reusable, growable 1-D buffer per dtype."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, np.dtype], Any] = {}

    def get(self, dtype: Any, count: int, like: Any = None) -> Any:
        """A 1-D view of at least ``count`` elements of ``dtype`` (contents undefined),
        allocated by the array library of ``like`` (numpy by default, CuPy for device)."""
        dtype = np.dtype(dtype)
        xp = np if like is None else array_namespace(like)
        buf = self._buffers.get((xp, dtype))
        if buf is None or buf.size < count:
            buf = xp.empty(max(count, 1), dtype=dtype)
            self._buffers[(xp, dtype)] = buf
        return buf[:count]

    def release(self) -> None:
        self._buffers.clear()


def pack(arrays: Sequence[np.ndarray], buffer: np.ndarray,
         scales: Sequence[float] | None = None) -> list[int]:
    """Copy ``arrays`` back to back into ``buffer`` (scaled); return the start offsets."""
    offsets = []
    pos = 0
    if len(arrays) > 1 and (scales is None or len(set(scales)) == 1):
        # One C loop over every array (200 small copies cost 200 Python calls otherwise).
        xp = array_namespace(buffer)
        for a in arrays:
            offsets.append(pos)
            pos += a.size
        xp.concatenate([a.reshape(-1) for a in arrays], out=buffer[:pos], casting="unsafe")
        if scales is not None and scales[0] != 1.0:
            scale_into(buffer[:pos], scales[0], buffer[:pos])
        return offsets
    for i, a in enumerate(arrays):
        n = a.size
        dst = buffer[pos:pos + n]
        scale = 1.0 if scales is None else scales[i]
        xp = array_namespace(a)
        if scale == 1.0:
            xp.copyto(dst, a.reshape(-1))
        else:
            scale_into(a.reshape(-1), scale, dst)
        offsets.append(pos)
        pos += n
    return offsets


def unpack(buffer: np.ndarray, outputs: Sequence[np.ndarray], offsets: Sequence[int],
           scales: Sequence[float] | None = None) -> None:
    """Copy slices of ``buffer`` into ``outputs`` (scaled), the inverse of ``pack``.

    ``buffer`` may be scaled in place (it is scratch space once unpacked).
    """
    if len(outputs) > 1 and scales is not None and len(set(scales)) == 1 and scales[0] != 1.0:
        end = offsets[-1] + outputs[-1].size
        if all(o.dtype == buffer.dtype for o in outputs):
            scale_into(buffer[:end], scales[0], buffer[:end])  # scale once, then copy
            scales = None
    for i, (out, start) in enumerate(zip(outputs, offsets)):
        src = buffer[start:start + out.size].reshape(out.shape)
        scale = 1.0 if scales is None else scales[i]
        if scale == 1.0:
            out[...] = src  # measured ~2x faster than copyto for 40 kB slices
        else:
            scale_into(src, scale, out)
