"""QSGD (Alistarh et al.): stochastic rounding of |x| / ||x||_2 to ``levels`` uniform levels.

Payloads: ([||x||_2], signed level per element as int8/int16/int32). Rounding up happens with
probability equal to the fractional part, so ``E[decompress(compress(x))] == x`` (unbiased).
Random numbers come from (seed, tensor name, per-name step), drawn on the host with numpy.
"""
from __future__ import annotations

import numpy as np

from dlcomm.array_api import array_namespace, compute_dtype, from_host, name_seed
from dlcomm.compression.base import ALLGATHER, Compressor, Context


def check_levels(levels: object) -> int:
    """Return ``levels`` as int; ValueError unless it is an int >= 1."""
    if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels < 1:
        raise ValueError(f"levels must be an int >= 1, got {levels!r}")
    return int(levels)


def level_dtype(levels: int) -> np.dtype:
    """Smallest signed integer dtype holding -levels..levels."""
    for dtype in (np.int8, np.int16, np.int32):
        if levels <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"levels={levels} does not fit in int32")


class QSGD(Compressor):
    """s-level stochastic quantisation, unbiased; not summable (each rank has its own norm)."""

    name = "qsgd"
    rounds = (ALLGATHER,)

    def __init__(self, levels: int = 16, seed: int = 0, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.levels = check_levels(levels)
        self.seed = int(seed)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        xp = array_namespace(tensor)
        step = self.states.get(name, 0)
        self.states[name] = step + 1
        flat = tensor.reshape(-1).astype(compute_dtype(tensor.dtype), copy=False)
        norm = xp.sqrt(xp.sum(flat * flat)).reshape(1)
        noise = name_seed(self.seed, name, step).random(flat.size, dtype=np.float32)
        if float(norm[0]) > 0:
            scaled = xp.abs(flat) * (self.levels / norm[0])
            q = xp.floor(scaled + from_host(noise, flat).astype(scaled.dtype, copy=False))
            q = xp.minimum(q, self.levels) * xp.sign(flat)
        else:
            q = xp.zeros_like(flat)
        return [norm, q.astype(level_dtype(self.levels))], self._context(tensor, name)

    def decompress(self, payloads: list, ctx: Context) -> object:
        norm, q = payloads
        unit = (norm[0] / self.levels).astype(ctx.dtype)
        return (q.astype(ctx.dtype) * unit).reshape(ctx.shape)

    def describe(self) -> str:
        return f"qsgd:levels={self.levels},seed={self.seed}"
