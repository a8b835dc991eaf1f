"""Selecting the k largest magnitudes of a flat array: exact, and an approximate threshold search.

``exact_topk_indices`` partitions (O(n), no full sort). ``approx_topk_indices`` follows the
idea of MSTopK: estimate the magnitude threshold of the k-th largest element from a strided
sample, then check it with one counting pass over the whole array and refine by bisection for
a few rounds; it returns about k indices (within ``tolerance``) and costs a few streaming passes
instead of a selection over all n elements.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dlcomm import kernels
from dlcomm.array_api import array_namespace

MIN_SAMPLE = 1 << 16
SAMPLE_HITS = 256


def index_dtype(n: int) -> object:
    """int32 indices when they fit (half the bytes on the wire), else int64."""
    return np.int32 if n < 2**31 else np.int64


def check_k(k: int, n: int) -> None:
    """Raise ValueError unless 1 <= k <= n."""
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")


def exact_topk_indices(flat: object, k: int) -> object:
    """Sorted indices of the ``k`` largest |flat| (ties broken by the partition, deterministic)."""
    xp = array_namespace(flat)
    n = flat.size
    check_k(k, n)
    if k == n:
        return xp.arange(n)
    magnitude = xp.abs(flat)
    nonzero = int(xp.count_nonzero(magnitude))
    if 8 * (n - nonzero) < n:
        idx = xp.argpartition(magnitude, n - k)[n - k:]
        return xp.sort(idx)
    # Many zeros (dead ReLU units, always-blank input pixels): numpy's introselect slows down
    # up to ~30x on blocks of equal keys (measured on a real MNIST first-layer gradient,
    # 1.6M elements, 48% zeros in whole rows and columns: 240 ms, against 16 ms for
    # selecting among the non-zeros and 7 ms for the same values shuffled), so select among
    # the non-zeros; with fewer than k of them, every non-zero is taken and the
    # lowest-indexed zeros (equal magnitudes) fill up to k.
    candidates = xp.flatnonzero(magnitude)
    if candidates.size > k:
        keep = xp.argpartition(magnitude[candidates], candidates.size - k)[candidates.size - k:]
        return xp.sort(candidates[keep])
    zeros = xp.flatnonzero(magnitude == 0)[: k - candidates.size]
    return xp.sort(xp.concatenate([candidates, zeros]))


def approx_topk_indices(
    flat: object, k: int, *, tolerance: float = 0.25, max_rounds: int = 8
) -> object:
    """Sorted indices of about ``k`` large |flat| values: every |value| above a threshold.

    The count lies in ``[k (1 - tolerance), k (1 + tolerance)]`` unless ``max_rounds`` passes
    of bisection did not get there (heavy ties); a count above that band falls back to an
    exact selection among the candidates, so never more than ``k (1 + tolerance)`` come back.
    """
    xp = array_namespace(flat)
    n = flat.size
    check_k(k, n)
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
    magnitude = xp.abs(flat)
    if not uses_threshold_search(n, k):
        return exact_topk_indices(flat, k)
    sample = magnitude[:: sample_step(n, k)]
    threshold = search_threshold(
        threshold_from_sample(xp, sample, n, k), k, tolerance, max_rounds,
        lambda t: int(xp.count_nonzero(magnitude >= t)),
    )
    high_k = k * (1 + tolerance)
    idx = xp.flatnonzero(magnitude >= threshold)
    if idx.size > high_k:
        keep = exact_topk_indices(flat[idx], k)
        idx = idx[keep]
    return idx


def uses_threshold_search(n: int, k: int) -> bool:
    """Whether ``approx_topk_indices`` searches a threshold (else it selects exactly)."""
    return not (n <= MIN_SAMPLE or k * 4 >= n)


def sample_step(n: int, k: int) -> int:
    """Stride of the sample that has about SAMPLE_HITS elements above the k-th largest."""
    sample_size = min(n, max(MIN_SAMPLE, SAMPLE_HITS * n // k))
    return max(1, n // sample_size)


def threshold_from_sample(xp: object, sample: object, n: int, k: int) -> object:
    """Estimate the k-th largest of n magnitudes from a strided ``sample`` of them."""
    hits = max(1, round(k * sample.size / n))
    kth = sample.size - hits
    return xp.partition(sample, kth)[kth]


def search_threshold(
    threshold: object, k: int, tolerance: float, max_rounds: int, count: Callable[[object], int]
) -> object:
    """Bisect from ``threshold`` until ``count(threshold)`` (elements >= it) is k within tolerance.

    ``count`` is the only pass over the data, so callers choose how it runs (numpy, or the
    native kernel that also adds the error-feedback residual on the fly).
    """
    low_k, high_k = k * (1 - tolerance), k * (1 + tolerance)
    lo, hi = None, None  # thresholds known to give too many / too few elements
    for _ in range(max_rounds):
        c = count(threshold)
        if low_k <= c <= high_k:
            break
        if c > high_k:
            lo = threshold
            threshold = threshold * 2 if hi is None else (threshold + hi) / 2
        else:
            hi = threshold
            threshold = threshold / 2 if lo is None else (threshold + lo) / 2
    return threshold


def native_topk_with_residual(
    grad: object, residual: object, k: int, *, tolerance: float = 0.25, max_rounds: int = 8,
    momentum_update: tuple | None = None,
) -> tuple | None:
    """Approximate top-k of ``acc = grad + residual`` and the error-feedback residual, fused.

    Returns (values, indices, new_residual) equal to ``approx_topk_indices(acc, k)`` with
    ``acc.flat[idx]`` and ``acc - scatter(values)`` (tests/unit/test_kernels.py), computed by the
    native kernels without materialising ``acc``; None when they do not apply (not numpy,
    not float32/64, library not built, exact selection needed), so the caller runs the
    reference instead. ``momentum_update=(g, m)``: ``grad`` is a velocity to update first,
    ``grad *= m; grad += g``, which the first counting pass does on the way; it is done
    whatever the function returns.
    """
    def update_now() -> None:
        if momentum_update is not None:
            kernels.momentum_update_(grad, *momentum_update)

    if not (kernels.available() and isinstance(grad, np.ndarray)
            and grad.dtype in (np.float32, np.float64)
            and grad.flags.c_contiguous
            and (residual is None or (isinstance(residual, np.ndarray)
                                      and residual.flags.c_contiguous))
            and (momentum_update is None or (
                isinstance(momentum_update[0], np.ndarray)
                and momentum_update[0].dtype == grad.dtype
                and momentum_update[0].shape == grad.shape
                and momentum_update[0].flags.c_contiguous))):
        update_now()
        return None
    n = grad.size
    check_k(k, n)
    if not uses_threshold_search(n, k):
        update_now()
        return None
    flat = grad.reshape(-1)
    step = sample_step(n, k)
    sample = flat[::step]
    pending = momentum_update is not None
    if pending:
        g, m = momentum_update
        sample = sample * flat.dtype.type(m) + g.reshape(-1)[::step]  # the updated values
    if residual is not None:
        sample = sample + residual.reshape(-1)[::step]

    def count(t: object) -> int:
        nonlocal pending
        if pending:
            pending = False
            return kernels.momentum_count_above_(grad, g, m, t, residual)
        return kernels.count_above(grad, t, residual)

    threshold = search_threshold(
        threshold_from_sample(np, np.abs(sample), n, k), k, tolerance, max_rounds, count)
    if pending:  # no counting pass ran (max_rounds == 0)
        update_now()
    values, indices, new_residual = kernels.ef_select(grad, threshold, residual, index_dtype(n))
    if indices.size > k * (1 + tolerance):
        return None  # the reference narrows to exactly k among these: let it
    return values, indices, new_residual
