"""The rank-order reduction both ``ordered`` (over MPI or the mesh) and the elastic jobs'
``TcpCommunicator`` use, so that they give the same bits for the same blocks."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dlcomm import kernels


def reduce_in_rank_order(blocks: np.ndarray | Sequence[np.ndarray], out: np.ndarray,
                         ufunc: np.ufunc) -> None:
    """``out = blocks[0]``, then ``out = ufunc(blocks[j], out)`` for j = 1..p-1: every element
    reduced in rank order. (The operand order matters only for which NaN payload survives;
    it is the native float16 sum's, and MPI's for a user op: incoming first.)"""
    np.copyto(out, blocks[0])
    if out.size == 0:
        return
    # The native float16 sum returns numpy's bits faster (tests/unit/test_kernels.py).
    fast_half_sum = out.dtype == np.float16 and ufunc is np.add and kernels.available()
    for block in blocks[1:]:
        if fast_half_sum:
            kernels.float16_add_(block, out)
        else:
            ufunc(block, out, out=out)
