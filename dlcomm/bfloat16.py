"""bfloat16 as uint16 bit patterns, for array libraries without a bfloat16 dtype (numpy).

bfloat16 is the top 16 bits of an IEEE float32. ``float_to_bf16_bits`` rounds to nearest,
ties to even (as hardware casts do) and keeps NaNs NaN; ``bf16_bits_to_float`` is exact.
"""
from __future__ import annotations

import numpy as np

from dlcomm.array_api import array_namespace

_QUIET_NAN_BF16 = 0x7FC0


def float_to_bf16_bits(x: object) -> object:
    """Round a float array to bfloat16 (nearest, ties to even); return uint16 bit patterns."""
    xp = array_namespace(x)
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds to nearest with ties to even.
    bias = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + bias) >> 16).astype(xp.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if bool(nan.any()):
        out[nan] = _QUIET_NAN_BF16
    return out


def bf16_bits_to_float(bits: object) -> object:
    """Expand uint16 bfloat16 bit patterns to float32 (exact)."""
    xp = array_namespace(bits)
    if bits.dtype != xp.uint16:
        raise TypeError(f"expected uint16 bfloat16 bit patterns, got {bits.dtype}")
    return (bits.astype(xp.uint32) << 16).view(xp.float32)
