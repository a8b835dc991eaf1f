"""Kronecker factors of a layer's Fisher block, on numpy arrays.

For a layer ``y = W x (+ b)`` K-FAC approximates the Fisher block of ``[W, b]`` by
``A (x) G`` with ``A = E[a a^T]`` (``a`` the input with a 1 appended for the bias) and
``G = E[g g^T]`` (``g`` the gradient of the loss with respect to the output). A convolution
is the same layer applied at every output position to the unfolded input patch; both factors
are then divided by the number of positions squared (kfac-pytorch's convention, which this
package keeps so that damping means the same in both).

The factors are symmetric, so only their upper triangle needs to travel: ``pack_upper`` and
``unpack_upper`` turn an n x n factor into its n (n + 1) / 2 entries and back.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np


def _as_float(x: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"expected a numpy array, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise TypeError(f"expected a floating-point array, got {x.dtype}")
    return x if dtype is None or x.dtype == dtype else x.astype(dtype)


def second_moment(rows: np.ndarray, bias: bool = False, scale: float = 1.0) -> np.ndarray:
    """``R^T R / len(R) * scale`` for ``R = [rows, 1]`` (the 1 column only with ``bias``),
    without copying ``rows``: the bias row and column are the column means."""
    if rows.ndim != 2:
        raise ValueError(f"rows must be 2-D (samples x features), got shape {rows.shape}")
    count = rows.shape[0]
    if count == 0:
        raise ValueError("no rows: a factor needs at least one sample")
    rows = np.ascontiguousarray(rows)
    d = rows.shape[1]
    weight = rows.dtype.type(scale / count)
    gram = rows.T @ rows  # numpy sees the transpose and runs a symmetric rank-k update
    if not bias:
        gram *= weight
        return gram
    out = np.empty((d + 1, d + 1), dtype=rows.dtype)
    np.multiply(gram, weight, out=out[:d, :d])
    means = rows.sum(axis=0) * weight
    out[:d, d] = means
    out[d, :d] = means
    out[d, d] = rows.dtype.type(scale)
    return out


def linear_input_factor(x: np.ndarray, bias: bool, dtype: np.dtype | None = None) -> np.ndarray:
    """A of a linear layer from its input ``x`` (..., in_features)."""
    x = _as_float(x, dtype)
    return second_moment(x.reshape(-1, x.shape[-1]), bias)


def linear_output_factor(grad: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """G of a linear layer from the gradient of its output (..., out_features)."""
    grad = _as_float(grad, dtype)
    return second_moment(grad.reshape(-1, grad.shape[-1]))


def _pair(value: int | Sequence[int], what: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    pair = tuple(int(v) for v in value)
    if len(pair) != 2:
        raise ValueError(f"{what} must be an int or a pair, got {value!r}")
    return pair  # type: ignore[return-value]


def conv2d_patches(x: np.ndarray, kernel_size: int | Sequence[int],
                   stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                   dilation: int | Sequence[int] = 1) -> np.ndarray:
    """The input patches of a 2-D convolution (im2col): ``x`` (batch, channels, H, W) ->
    (batch, out_h, out_w, channels * kh * kw), features ordered as ``weight.reshape(out, -1)``
    orders them (channel, then kernel row, then kernel column); zero padding."""
    if x.ndim != 4:
        raise ValueError(f"conv2d input must be (batch, channels, H, W), got shape {x.shape}")
    kh, kw = _pair(kernel_size, "kernel_size")
    sh, sw = _pair(stride, "stride")
    ph, pw = _pair(padding, "padding")
    dh, dw = _pair(dilation, "dilation")
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError("kernel_size, stride and dilation must be >= 1 and padding >= 0")
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    span_h, span_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    if x.shape[2] < span_h or x.shape[3] < span_w:
        raise ValueError(f"kernel ({kh}x{kw}, dilation {dh}x{dw}) is larger than the padded "
                         f"input ({x.shape[2]}x{x.shape[3]})")
    windows = np.lib.stride_tricks.sliding_window_view(x, (span_h, span_w), axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw, ::dh, ::dw]  # (B, C, oh, ow, kh, kw)
    b, c, oh, ow = windows.shape[:4]
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(b, oh, ow, c * kh * kw)


def conv2d_input_factor(x: np.ndarray, bias: bool, kernel_size: int | Sequence[int],
                        stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                        dilation: int | Sequence[int] = 1,
                        dtype: np.dtype | None = None) -> np.ndarray:
    """A of a 2-D convolution from its input: the patches' second moment (with the bias 1),
    divided by the number of output positions squared."""
    x = _as_float(x, dtype)
    patches = conv2d_patches(x, kernel_size, stride, padding, dilation)
    positions = patches.shape[1] * patches.shape[2]
    return second_moment(patches.reshape(-1, patches.shape[-1]), bias,
                         scale=1.0 / positions ** 2)


def conv2d_output_factor(grad: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """G of a 2-D convolution from the gradient of its output (batch, out_ch, out_h, out_w):
    the second moment over batch and positions, divided by the positions squared."""
    grad = _as_float(grad, dtype)
    if grad.ndim != 4:
        raise ValueError(f"conv2d output gradient must be 4-D, got shape {grad.shape}")
    positions = grad.shape[2] * grad.shape[3]
    rows = grad.transpose(0, 2, 3, 1).reshape(-1, grad.shape[1])
    return second_moment(rows, scale=1.0 / positions ** 2)


@lru_cache(maxsize=256)
def _upper_indices(n: int) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.triu_indices(n)
    return rows, cols


def upper_size(n: int) -> int:
    """Entries in the upper triangle (diagonal included) of an n x n matrix."""
    return n * (n + 1) // 2


def pack_upper(matrix: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The upper triangle of a square matrix, row by row, as a 1-D array."""
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"pack_upper needs a square matrix, got shape {matrix.shape}")
    rows, cols = _upper_indices(matrix.shape[0])
    if out is None:
        return matrix[rows, cols]
    out[...] = matrix[rows, cols]
    return out


def unpack_upper(packed: np.ndarray, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The symmetric n x n matrix whose upper triangle ``pack_upper`` gave."""
    if packed.shape != (upper_size(n),):
        raise ValueError(f"a packed {n} x {n} triangle has {upper_size(n)} entries, got "
                         f"shape {packed.shape}")
    rows, cols = _upper_indices(n)
    if out is None:
        out = np.empty((n, n), dtype=packed.dtype)
    out[rows, cols] = packed
    out[cols, rows] = packed
    return out


def running_average(current: np.ndarray | None, new: np.ndarray, decay: float) -> np.ndarray:
    """``decay * current + (1 - decay) * new``; the first update starts from the identity,
    as kfac-pytorch does."""
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"factor_decay must be in (0, 1], got {decay}")
    if current is None:
        current = np.eye(new.shape[0], dtype=new.dtype)
    if current.shape != new.shape:
        raise ValueError(f"factor shape changed from {current.shape} to {new.shape}")
    out = current * new.dtype.type(decay)
    out += new * new.dtype.type(1.0 - decay)
    return out
