"""QSGD (Alistarh et al.): stochastic rounding of |x| / ||bucket|| to ``levels`` uniform levels.

The flat tensor is cut into buckets of ``bucket`` consecutive elements (the last may be
shorter), each quantised against its own norm, as the paper's experiments do (bucket size
512). The variance grows with the number of elements sharing a norm: the paper's bound for
the L2 norm is ``min(d / s^2, sqrt(d) / s) ||x||^2`` for d elements and s levels, so one norm
for a 65,536-element layer at 16 levels allows noise four times the gradient. ``norm=inf``
(the default) scales by the bucket's largest magnitude instead of its L2 norm, the variant
the paper's experiments use (called QSGDinf by later work): the level spacing shrinks from
||b||_2 / s to max|b| / s, several times smaller for a bucket of 512, and every element
still lies within the levels, so rounding stays unbiased. ``norm=2`` is the analysed form.

Payloads: (one norm per bucket, signed level per element as int8/int16/int32). Rounding up
happens with probability equal to the fractional part, so ``E[decompress(compress(x))] == x``
(unbiased). Random numbers come from (seed, tensor name, per-name step), drawn on the host.
"""
from __future__ import annotations

import numpy as np

from dlcomm.array_api import array_namespace, compute_dtype, from_host, name_seed
from dlcomm.compression.base import ALLGATHER, Compressor, Context

DEFAULT_BUCKET = 512
NORMS = (2.0, float("inf"))


def check_levels(levels: object) -> int:
    """Return ``levels`` as int; ValueError unless it is an int >= 1."""
    if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels < 1:
        raise ValueError(f"levels must be an int >= 1, got {levels!r}")
    return int(levels)


def check_bucket(bucket: object) -> int:
    """Return ``bucket`` as int; ValueError unless it is an int >= 1."""
    if isinstance(bucket, bool) or not isinstance(bucket, (int, np.integer)) or bucket < 1:
        raise ValueError(f"bucket must be an int >= 1 (elements per norm), got {bucket!r}")
    return int(bucket)


def check_norm(norm: object) -> float:
    """Return ``norm`` as float; ValueError unless it is 2 or inf."""
    if isinstance(norm, bool) or not isinstance(norm, (int, float)) or float(norm) not in NORMS:
        raise ValueError(f"norm must be 2 (L2) or inf (largest magnitude), got {norm!r}")
    return float(norm)


def level_dtype(levels: int) -> np.dtype:
    """Smallest signed integer dtype holding -levels..levels."""
    for dtype in (np.int8, np.int16, np.int32):
        if levels <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"levels={levels} does not fit in int32")


def bucket_norms(flat: object, bucket: int, norm: float = 2.0) -> object:
    """The L2 norm (``norm=2``) or largest magnitude (``norm=inf``) of each run of ``bucket``
    consecutive elements of ``flat`` (the last run may be shorter)."""
    xp = array_namespace(flat)
    count = -(-flat.size // bucket)
    padded = xp.zeros(count * bucket, dtype=flat.dtype)
    padded[:flat.size] = flat
    blocks = padded.reshape(count, bucket)
    if norm == float("inf"):
        return xp.max(xp.abs(blocks), axis=1)
    return xp.sqrt(xp.sum(blocks * blocks, axis=1))


def per_element(values: object, bucket: int, n: int) -> object:
    """Each bucket's value repeated over its elements (the first ``n``)."""
    xp = array_namespace(values)
    return xp.repeat(values, bucket)[:n]


class QSGD(Compressor):
    """s-level stochastic quantisation per bucket, unbiased; not summable (each rank has its
    own norms)."""

    name = "qsgd"
    rounds = (ALLGATHER,)

    def __init__(self, levels: int = 16, seed: int = 0, bucket: int = DEFAULT_BUCKET,
                 norm: float = float("inf"), **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.levels = check_levels(levels)
        self.seed = int(seed)
        self.bucket = check_bucket(bucket)
        self.norm = check_norm(norm)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        xp = array_namespace(tensor)
        step = self.states.get(name, 0)
        self.states[name] = step + 1
        flat = tensor.reshape(-1).astype(compute_dtype(tensor.dtype), copy=False)
        norms = bucket_norms(flat, self.bucket, self.norm)
        noise = name_seed(self.seed, name, step).random(flat.size, dtype=np.float32)
        norm = per_element(norms, self.bucket, flat.size)
        positive = norm > 0
        scaled = xp.abs(flat) * (self.levels / xp.where(positive, norm, 1))
        q = xp.floor(scaled + from_host(noise, flat).astype(scaled.dtype, copy=False))
        q = xp.where(positive, xp.minimum(q, self.levels) * xp.sign(flat), 0)
        return [norms, q.astype(level_dtype(self.levels))], self._context(tensor, name)

    def decompress(self, payloads: list, ctx: Context) -> object:
        norms, q = payloads
        unit = per_element(norms / self.levels, self.bucket, ctx.size).astype(ctx.dtype)
        return (q.astype(ctx.dtype) * unit).reshape(ctx.shape)

    def describe(self) -> str:
        norm = "inf" if self.norm == float("inf") else "2"
        return f"qsgd:levels={self.levels},seed={self.seed},bucket={self.bucket},norm={norm}"
