"""``reduce_into`` (the ring's, halving-doubling's and tree's combine step) sums float16
through the native kernel with numpy's bits (NaN payloads aside), and numpy's otherwise."""
from __future__ import annotations

import numpy as np
import pytest

from dlcomm import kernels
from dlcomm.collectives.reduction import reduce_into


@pytest.mark.parametrize("n", [0, 1, 1001, (1 << 18) + 13])
def test_float16_sum_equals_numpy_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    acc = (rng.standard_normal(n) * 10.0 ** rng.integers(-7, 5, n)).astype(np.float16)
    incoming = (rng.standard_normal(n) * 10.0 ** rng.integers(-7, 5, n)).astype(np.float16)
    with np.errstate(all="ignore"):
        want = np.add(acc, incoming)
        reduce_into(acc, incoming, np.add)
    assert np.array_equal(acc.view(np.uint16), want.view(np.uint16))


def test_other_ops_and_dtypes_take_numpy() -> None:
    acc, incoming = np.array([1.0, 5.0], np.float16), np.array([3.0, 2.0], np.float16)
    reduce_into(acc, incoming, np.maximum)
    assert acc.tolist() == [3.0, 5.0]
    acc32 = np.array([1.5], np.float32)
    reduce_into(acc32, np.array([2.0], np.float32), np.add)
    assert acc32.tolist() == [3.5]


def test_the_native_kernel_is_what_runs_when_available(monkeypatch) -> None:
    if not kernels.available():
        pytest.skip(f"native library not in use: {kernels.load_error()}")
    calls = []
    monkeypatch.setattr(kernels, "float16_add_", lambda a, b: calls.append(a.size) or b)
    reduce_into(np.ones(4, np.float16), np.ones(4, np.float16), np.add)
    assert calls == [4]
