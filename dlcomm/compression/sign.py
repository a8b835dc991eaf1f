"""1-bit sign compressors: ``efsignsgd`` (scaled sign, with error feedback) and ``signum``.

Signs travel packed 8 per byte (``packbits``); zeros count as +1. ``efsignsgd`` (Karimireddy
et al.) sends ``scale = mean |x|`` with the signs, so ``scale * sign(x)`` has the L1 norm of x.
``signum`` (Bernstein et al.) sends bare signs and aggregates by majority vote: the result is
the sign of the sum of the ranks' signs (0 where the vote ties).
"""
from __future__ import annotations

import numpy as np

from dlcomm import kernels as native  # the C++ kernels' loader
from dlcomm.array_api import array_namespace, compute_dtype
from dlcomm.compression.base import ALLGATHER, Compressor, Context, check_op


def pack_signs(flat: object) -> object:
    """1 bit per element: bit set where ``flat >= 0``."""
    xp = array_namespace(flat)
    return xp.packbits(flat >= 0)


def unpack_signs(packed: object, n: int, dtype: object) -> object:
    """+1/-1 of ``dtype`` from ``pack_signs`` output, for the first ``n`` elements."""
    xp = array_namespace(packed)
    bits = xp.unpackbits(packed)[:n]
    return bits.astype(dtype) * 2 - 1


def _pack(flat: object) -> object:
    """``pack_signs`` with the native kernel for numpy arrays (same bytes)."""
    if isinstance(flat, np.ndarray) and native.available():
        return native.pack_signs(flat)
    return pack_signs(flat)


def _unpack(packed: object, n: int, dtype: object, scale: object = None) -> object:
    """``unpack_signs(...) * scale.astype(dtype)`` (scale None: bare signs), native for numpy."""
    if isinstance(packed, np.ndarray) and native.available():
        return native.unpack_signs(packed, n, dtype, scale)
    signs = unpack_signs(packed, n, dtype)
    return signs if scale is None else signs * scale.astype(dtype)


class EFSignSGD(Compressor):
    """Scaled sign: payloads (packed signs, [mean |x|]); decompress gives mean|x| * sign(x)."""

    name = "efsignsgd"
    rounds = (ALLGATHER,)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        xp = array_namespace(tensor)
        flat = tensor.reshape(-1)
        scale = xp.mean(xp.abs(flat), dtype=compute_dtype(flat.dtype)).reshape(1)
        return [_pack(flat), scale], self._context(tensor, name)

    def decompress(self, payloads: list, ctx: Context) -> object:
        packed, scale = payloads
        return _unpack(packed, ctx.size, ctx.dtype, scale).reshape(ctx.shape)


class Signum(Compressor):
    """Bare signs; ``aggregate`` is a majority vote (``op`` does not rescale a vote)."""

    name = "signum"
    rounds = (ALLGATHER,)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        return [_pack(tensor.reshape(-1))], self._context(tensor, name)

    def decompress(self, payloads: list, ctx: Context) -> object:
        return _unpack(payloads[0], ctx.size, ctx.dtype).reshape(ctx.shape)

    def aggregate(self, tensors: list, op: str = "average") -> object:
        check_op(op)
        if not tensors:
            raise ValueError("aggregate needs at least one tensor")
        xp = array_namespace(tensors[0])
        votes = tensors[0].copy()
        for t in tensors[1:]:
            votes += t
        return xp.sign(votes)
