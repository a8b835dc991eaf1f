"""Selecting the k largest magnitudes of a flat array: exact, and an approximate threshold search.

``exact_topk_indices`` partitions (O(n), no full sort). ``approx_topk_indices`` follows the
idea of MSTopK: estimate the magnitude threshold of the k-th largest element from a strided
sample, then check it with one counting pass over the whole array and refine by bisection for
a few rounds; it returns about k indices (within ``tolerance``) and costs a few streaming passes
instead of a selection over all n elements.
"""
from __future__ import annotations

from dlcomm.compression.array_api import array_namespace

MIN_SAMPLE = 1 << 16
SAMPLE_HITS = 256


def index_dtype(n: int) -> object:
    """int32 indices when they fit (half the bytes on the wire), else int64."""
    import numpy as np  # noqa: PLC0415 - dtype objects are shared by numpy and cupy

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
    idx = xp.argpartition(magnitude, n - k)[n - k:]
    return xp.sort(idx)


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
    if n <= MIN_SAMPLE or k * 4 >= n:
        return exact_topk_indices(flat, k)
    threshold = _sample_threshold(xp, magnitude, k)
    low_k, high_k = k * (1 - tolerance), k * (1 + tolerance)
    lo, hi = None, None  # thresholds known to give too many / too few elements
    for _ in range(max_rounds):
        count = int(xp.count_nonzero(magnitude >= threshold))
        if low_k <= count <= high_k:
            break
        if count > high_k:
            lo = threshold
            threshold = threshold * 2 if hi is None else (threshold + hi) / 2
        else:
            hi = threshold
            threshold = threshold / 2 if lo is None else (threshold + lo) / 2
    idx = xp.flatnonzero(magnitude >= threshold)
    if idx.size > high_k:
        keep = exact_topk_indices(flat[idx], k)
        idx = idx[keep]
    return idx


def _sample_threshold(xp: object, magnitude: object, k: int) -> object:
    """Estimate the k-th largest magnitude from a strided sample with ~SAMPLE_HITS hits above it."""
    n = magnitude.size
    sample_size = min(n, max(MIN_SAMPLE, SAMPLE_HITS * n // k))
    sample = magnitude[:: max(1, n // sample_size)]
    hits = max(1, round(k * sample.size / n))
    kth = sample.size - hits
    return xp.partition(sample, kth)[kth]
