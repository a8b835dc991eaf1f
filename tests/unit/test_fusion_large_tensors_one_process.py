"""Which all-reduces a fusion group turns into: tensors of ``SOLO_TENSOR_BYTES`` and more go
alone, straight into their outputs, after the rest, which are packed together (or go alone
when only one is left). A recording communicator stands for two ranks holding the same
data."""
from __future__ import annotations

import numpy as np
import pytest

from dlcomm.engine.operations.allreduce import SOLO_TENSOR_BYTES, DenseAllreduce
from dlcomm.engine.operations.base import EngineState
from dlcomm.engine.timeline import NullTimeline
from dlcomm.ops import ReduceOp


class TwoEqualRanks:
    """``allreduce`` as if a second rank held the same data: the result is twice the input."""

    def __init__(self) -> None:
        self.calls: list[int] = []  # elements of each all-reduce

    def allreduce(self, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
        self.calls.append(send.size)
        np.multiply(send, 2, out=recv)


BIG = SOLO_TENSOR_BYTES // 4  # float32 elements


@pytest.mark.parametrize("sizes, calls", [
    ([BIG, 3, 1000], [1003, BIG]),          # the two small ones packed, then the big one alone
    ([7, BIG + 1], [7, BIG + 1]),           # one small one left: it goes alone too, first
    ([BIG, BIG + 5], [BIG, BIG + 5]),       # nothing left to pack
    ([5, 6, 7], [18]),                      # all small: one packed all-reduce
    ([BIG - 1, 2], [BIG + 1]),              # just under the size: packed
])
def test_large_tensors_go_alone_and_the_rest_is_packed(sizes: list[int],
                                                       calls: list[int]) -> None:
    state = EngineState(rank=0, process_sets={}, timeline=NullTimeline(),
                        fusion_threshold=64 << 20)
    comm = TwoEqualRanks()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    outputs = [x.copy() for x in inputs]  # in place, as the optimizers submit
    pre = [0.5] * len(sizes)
    post = [3.0] * len(sizes)
    DenseAllreduce(state)._fused(comm, outputs, outputs, pre, post, ReduceOp.SUM,
                                 ["group"] * len(sizes), np.dtype(np.float32))
    assert comm.calls == calls
    for x, out in zip(inputs, outputs):
        np.testing.assert_allclose(out, x * np.float32(0.5) * 2 * 3, rtol=1e-6)
