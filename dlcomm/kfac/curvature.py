"""From factors to a preconditioned gradient, on numpy arrays.

K-FAC replaces a layer's gradient ``V`` (out x in, the bias as a last column) by
``(G (x) A + damping)^-1 vec(V)`` computed two ways, as kfac-pytorch does:

* ``inverse``: ``(G + damping I)^-1 V (A + damping I)^-1`` (damping on each factor);
* ``eigen``: with ``A = Qa diag(da) Qa^T`` and ``G = Qg diag(dg) Qg^T``,
  ``Qg [(Qg^T V Qa) / (dg da^T + damping)] Qa^T``, the exact inverse of
  ``G (x) A + damping I``.

``kl_clip_scale`` is the step-size rescaling that keeps the update's predicted change of the
output distribution below ``kl_clip``. The dense decompositions come from a ``Linalg`` (numpy's
LAPACK by default), so a front end can hand in its framework's faster LAPACK while the maths
stays here.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np


class Linalg(NamedTuple):
    """The two dense routines K-FAC needs, on numpy arrays: ``eigh(a) -> (values, vectors)``
    of a symmetric matrix (its lower triangle), and ``inv(a)``."""

    eigh: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    inv: Callable[[np.ndarray], np.ndarray]


NUMPY_LINALG = Linalg(np.linalg.eigh, np.linalg.inv)


def _check_square(matrix: np.ndarray, what: str) -> None:
    if not isinstance(matrix, np.ndarray) or matrix.ndim != 2 \
            or matrix.shape[0] != matrix.shape[1]:
        shape = getattr(matrix, "shape", None)
        raise ValueError(f"{what} must be a square numpy matrix, got shape {shape}")


def damped_inverse(factor: np.ndarray, damping: float, dtype: np.dtype = np.float32,
                   linalg: Linalg = NUMPY_LINALG) -> np.ndarray:
    """``(factor + damping I)^-1``, symmetrised so that its upper triangle says it all."""
    _check_square(factor, "factor")
    if not damping > 0:
        raise ValueError(f"damping must be > 0, got {damping}")
    work = factor.astype(np.float32, copy=True) if factor.dtype != np.float64 else \
        factor.copy()
    work[np.diag_indices_from(work)] += work.dtype.type(damping)
    inverse = np.array(linalg.inv(work), dtype=work.dtype)  # a copy we own
    inverse += inverse.T  # exactly symmetric: a + b == b + a in floating point
    inverse *= inverse.dtype.type(0.5)
    return inverse.astype(dtype, copy=False)


def eigen_decomposition(factor: np.ndarray, dtype: np.dtype = np.float32,
                        linalg: Linalg = NUMPY_LINALG) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (clamped at 0) and eigenvectors (columns) of a symmetric factor."""
    _check_square(factor, "factor")
    work = factor if factor.dtype == np.float64 else factor.astype(np.float32, copy=False)
    values, vectors = linalg.eigh(work)
    values = np.maximum(values, 0).astype(dtype, copy=False)
    return values, np.asarray(vectors).astype(dtype, copy=False)


def eigen_scale(g_values: np.ndarray, a_values: np.ndarray, damping: float) -> np.ndarray:
    """``1 / (dg da^T + damping)``: what the eigenbasis form multiplies by."""
    if not damping > 0:
        raise ValueError(f"damping must be > 0, got {damping}")
    outer = np.multiply.outer(g_values, a_values)
    outer += outer.dtype.type(damping)
    return np.reciprocal(outer, out=outer)


def precondition_inverse(grad: np.ndarray, g_inverse: np.ndarray,
                         a_inverse: np.ndarray) -> np.ndarray:
    """``G^-1 grad A^-1`` for ``grad`` of shape (g_dim, a_dim)."""
    _check_grad(grad, g_inverse.shape[0], a_inverse.shape[0])
    work = grad.astype(a_inverse.dtype, copy=False)
    return (g_inverse @ work) @ a_inverse


def precondition_eigen(grad: np.ndarray, g_vectors: np.ndarray, a_vectors: np.ndarray,
                       scale: np.ndarray) -> np.ndarray:
    """``Qg [(Qg^T grad Qa) * scale] Qa^T`` with ``scale`` from ``eigen_scale``."""
    _check_grad(grad, g_vectors.shape[0], a_vectors.shape[0])
    work = grad.astype(a_vectors.dtype, copy=False)
    rotated = (g_vectors.T @ work) @ a_vectors
    rotated *= scale
    return (g_vectors @ rotated) @ a_vectors.T


def _check_grad(grad: np.ndarray, g_dim: int, a_dim: int) -> None:
    if grad.shape != (g_dim, a_dim):
        raise ValueError(f"gradient matrix has shape {grad.shape}, expected ({g_dim}, {a_dim}) "
                         "(out x in, with the bias as a last column)")


def kl_clip_scale(vg_sum: float, kl_clip: float | None) -> float:
    """``min(1, sqrt(kl_clip / |vg_sum|))``, where ``vg_sum`` = sum over layers of
    preconditioned gradient x gradient x lr^2; 1 when clipping is off or the sum is 0."""
    if kl_clip is None or vg_sum == 0.0:
        return 1.0
    if not math.isfinite(vg_sum):
        raise FloatingPointError(f"K-FAC's KL-clip sum is {vg_sum}: a gradient or factor "
                                 "is not finite (raise damping, lower the learning rate)")
    return min(1.0, math.sqrt(kl_clip / abs(vg_sum)))
