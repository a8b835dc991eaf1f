"""Top-k: the k = ceil(ratio n) largest magnitudes of an array and their positions.

Keeping the k largest of n squared values keeps at least k/n of the energy, so the error is
at most sqrt(1 - k/n) ||x|| (exactly sqrt of the energy left out, which the encoder states).
Selection is ``dlcomm.compression``'s exact top-k; indices travel as int32 below 2^31.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.compression.topk_select import exact_topk_indices, index_dtype
from dlcomm.split.codec import (
    FLOAT16_SUBNORMAL,
    FLOAT16_UNIT,
    Codec,
    Encoded,
    check_array,
    check_factor_dtype,
    read_tensor_meta,
    scaled_float16,
    tensor_meta,
)


class TopKCodec(Codec):
    """The ``ratio`` largest magnitudes (values in ``dtype``) and their int32 positions."""

    name = "topk"

    def __init__(self, ratio: float = 0.01, dtype: str = "float32") -> None:
        super().__init__()
        if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or \
                not 0.0 < ratio <= 1.0:
            raise ValueError(f"topk: ratio must be in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)
        self.dtype = check_factor_dtype(dtype)

    def k_for(self, n: int) -> int:
        return max(1, min(n, math.ceil(self.ratio * n)))

    def encode(self, x: Any) -> Encoded:
        check_array(x)
        if not np.issubdtype(np.dtype(x.dtype), np.floating):
            raise TypeError(f"topk encodes floating-point arrays, got {x.dtype}")
        xp = array_namespace(x)
        flat = xp.ascontiguousarray(x).reshape(-1)
        if flat.size == 0:
            return Encoded((flat, flat.astype(np.int32), xp.ones(1, dtype=np.float32)),
                           (*tensor_meta(x), 0, 1_000_000))
        k = self.k_for(flat.size)
        idx = exact_topk_indices(flat, k).astype(index_dtype(flat.size))
        values = flat[idx]
        v64 = values.astype(np.float64)
        total = float((flat.astype(np.float64) ** 2).sum())
        kept = float((v64 ** 2).sum()) / total if total > 0 else 1.0
        self.last_stats = {"k": k, "energy_kept": kept}
        if self.dtype == np.float16:
            values, scale = scaled_float16(values)
        else:
            values, scale = values.astype(np.float32), xp.ones(1, dtype=np.float32)
        # kept energy in ppm, rounded down: the stated error holds on the receiving side too
        return Encoded((values, idx, scale), (*tensor_meta(x), k, math.floor(kept * 1e6)))

    def decode(self, encoded: Encoded) -> Any:
        dtype, shape, _ = read_tensor_meta(encoded.meta)
        values, idx, scale = encoded.parts
        xp = array_namespace(values)
        out = xp.zeros(int(np.prod(shape, dtype=np.int64)), dtype=dtype)
        out[idx] = (values.astype(np.float32) * scale[0]).astype(dtype)
        return out.reshape(shape)

    def relative_error_bound(self, encoded: Encoded) -> float:
        _, shape, (k, kept_ppm) = read_tensor_meta(encoded.meta)
        bound = math.sqrt(max(0.0, 1.0 - kept_ppm / 1e6))
        if self.dtype == np.float16:
            bound += FLOAT16_UNIT + FLOAT16_SUBNORMAL * math.sqrt(max(k, 1))
        return bound + 1e-6

    def describe(self) -> str:
        return f"topk:ratio={self.ratio:g},dtype={self.dtype.name}"
