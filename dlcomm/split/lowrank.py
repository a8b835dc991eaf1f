"""Low-rank activations: per batch, the truncated SVD of the [tokens x hidden] matrix.

An activation of shape (..., n) is the matrix M = x.reshape(-1, n) (a batch of sequences:
[batch*tokens x hidden]; a batch of feature vectors: [batch x features]). With M's singular
values s_1 >= s_2 >= ... the rank-r truncation keeps the energy sum_{i<=r} s_i^2 / ||M||_F^2
and errs by exactly ||M - M_r||_F = sqrt(sum_{i>r} s_i^2). The rank is fixed (``rank=R``) or
the smallest that keeps ``energy=E`` of the batch's energy (error <= sqrt(1 - E) ||M||),
capped by ``max_rank``. The SVD comes from the eigen-decomposition of the smaller Gram
matrix (M^T M, or M M^T when M is wide) in float64: for [1024 x 384] that is one product and
a 384 x 384 ``eigh``, far cheaper than an SVD of M. What travels is a coefficient factor
C = M B (rows x r) and the orthonormal basis B (n x r), or the transposed pair for wide M:
r (rows + n) numbers instead of rows x n. When that is no fewer, the array travels as it is.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from dlcomm.array_api import array_namespace
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

RAW, BASIS_RIGHT, BASIS_LEFT = 0, 1, 2  # how an encoded array's parts are laid out


def as_matrix(x: Any) -> Any:
    """The [rows x last dimension] view of ``x`` (a 0-/1-D array is one row)."""
    n = x.shape[-1] if x.ndim else 1
    return x.reshape(-1, n)


def spectrum(matrix: Any) -> tuple[Any, Any, bool]:
    """(squared singular values, descending; the matching orthonormal singular vectors of the
    smaller side as columns; True when they are the right singular vectors)."""
    xp = array_namespace(matrix)
    m64 = matrix.astype(np.float64)
    rows, cols = m64.shape
    right = cols <= rows
    gram = m64.T @ m64 if right else m64 @ m64.T
    values, vectors = xp.linalg.eigh(gram)
    return xp.clip(values[::-1], 0, None), vectors[:, ::-1], right


def rank_for_energy(energies: Any, energy: float) -> int:
    """The smallest r whose r largest squared singular values hold ``energy`` of the total."""
    xp = array_namespace(energies)
    total = float(energies.sum())
    if total <= 0:
        return 1
    kept = xp.cumsum(energies) / total
    return int(min(int(xp.searchsorted(kept, energy * (1 - 1e-12))) + 1, energies.size))


class LowRankCodec(Codec):
    """Rank-r factors of each batch's activation matrix, r fixed or chosen by energy."""

    name = "lowrank"

    def __init__(self, rank: int | None = None, energy: float | None = None,
                 max_rank: int | None = None, dtype: str = "float32") -> None:
        super().__init__()
        if (rank is None) == (energy is None):
            raise ValueError("lowrank needs exactly one of rank=R (fixed) or energy=E "
                             "(smallest rank keeping that fraction of the energy)")
        for what, v in (("rank", rank), ("max_rank", max_rank)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)
                                  or v < 1):
                raise ValueError(f"lowrank: {what} must be an int >= 1, got {v!r}")
        if energy is not None and (isinstance(energy, bool) or not isinstance(
                energy, numbers.Real) or not 0.0 < energy <= 1.0):
            raise ValueError(f"lowrank: energy must be in (0, 1], got {energy!r}")
        self.rank = None if rank is None else int(rank)
        self.energy = None if energy is None else float(energy)
        self.max_rank = None if max_rank is None else int(max_rank)
        self.dtype = check_factor_dtype(dtype)

    def choose_rank(self, energies: Any) -> int:
        """The rank for a matrix whose squared singular values are ``energies``."""
        r = self.rank if self.rank is not None else rank_for_energy(energies, self.energy)
        if self.max_rank is not None:
            r = min(r, self.max_rank)
        return max(1, min(r, energies.size))

    def encode(self, x: Any) -> Encoded:
        check_array(x)
        if not np.issubdtype(np.dtype(x.dtype), np.floating):
            raise TypeError(f"lowrank encodes floating-point arrays, got {x.dtype}")
        xp = array_namespace(x)
        m = as_matrix(x)
        rows, cols = m.shape
        if rows == 0 or cols == 0:
            return self._raw(x)
        energies, vectors, right = spectrum(m)
        r = self.choose_rank(energies)
        if r * (rows + cols) >= rows * cols:
            return self._raw(x)
        basis = vectors[:, :r]
        coef = m.astype(np.float64) @ basis if right else m.astype(np.float64).T @ basis
        total = float(energies.sum())
        kept = float(energies[:r].sum()) / total if total > 0 else 1.0
        self.last_stats = {"rank": r, "energy_kept": kept}
        if self.dtype == np.float16:
            coef_part, scales = scaled_float16(coef, axis=0)
        else:
            coef_part, scales = coef.astype(np.float32), xp.ones(r, dtype=np.float32)
        parts = (xp.ascontiguousarray(coef_part), xp.ascontiguousarray(basis.astype(self.dtype)),
                 scales)
        layout = BASIS_RIGHT if right else BASIS_LEFT
        # the kept energy travels as parts per million: it states the error on either side
        return Encoded(parts, (*tensor_meta(x), layout, r, round(kept * 1_000_000)))

    def _raw(self, x: Any) -> Encoded:
        self.last_stats = {"rank": min(as_matrix(x).shape), "energy_kept": 1.0}
        xp = array_namespace(x)
        return Encoded((xp.ascontiguousarray(x).reshape(-1),), (*tensor_meta(x), RAW, 0, 0))

    def decode(self, encoded: Encoded) -> Any:
        dtype, shape, (layout, _, _) = read_tensor_meta(encoded.meta)
        if layout == RAW:
            return encoded.parts[0].astype(dtype, copy=False).reshape(shape)
        coef, basis, scales = encoded.parts
        coef = coef.astype(np.float32) * scales.reshape(1, -1)
        basis = basis.astype(np.float32)
        m = coef @ basis.T if layout == BASIS_RIGHT else basis @ coef.T
        return m.astype(dtype, copy=False).reshape(shape)

    def relative_error_bound(self, encoded: Encoded) -> float:
        _, _, (layout, r, kept_ppm) = read_tensor_meta(encoded.meta)
        if layout == RAW:
            return 0.0
        # kept_ppm is rounded to the nearest ppm: allow one more ppm of lost energy
        bound = math.sqrt(max(0.0, 1.0 - (kept_ppm - 1) / 1_000_000))
        if self.dtype == np.float16:
            # C~ = C + dC, B~ = B + dB, |dC| <= u |C|, |dB| <= u |B| (plus subnormals):
            # ||C~ B~^T - C B^T|| <= ||dC|| ||B||_2 + ||C~|| ||dB||, ||B||_2 = 1,
            # ||dB|| <= u sqrt(r), ||C|| <= ||x||: at most (u + (1 + u) u sqrt(r)) ||x||
            rows = encoded.parts[0].shape[0]
            bound += (3 * FLOAT16_UNIT + 2 * FLOAT16_SUBNORMAL * math.sqrt(rows)) * math.sqrt(r)
        else:
            bound += 1e-5  # float32 factors and products
        return bound

    def describe(self) -> str:
        head = f"rank={self.rank}" if self.rank is not None else f"energy={self.energy:g}"
        if self.max_rank is not None:
            head += f",max_rank={self.max_rank}"
        return f"lowrank:{head},dtype={self.dtype.name}"
