"""Reduction operators for the point-to-point collectives: ReduceOp -> numpy ufunc.

The algorithms combine a received block into the local one with ``ufunc(local, received,
out=local)``, so every reduction is elementwise, in place, and works for any numpy (or
array-API) array. Average is not an operator here: the caller sums, then scales once.
"""
from __future__ import annotations

import numpy as np

from dlcomm import kernels
from dlcomm.ops import ReduceOp, as_reduce_op

_UFUNCS: dict[ReduceOp, np.ufunc] = {
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}

SUPPORTED_OPS = tuple(_UFUNCS)


def as_collective_op(op: object) -> ReduceOp:
    """Accept a ``ReduceOp`` or its name; reject Average and Adasum with a ``ValueError``.

    Average is refused because averaging inside an algorithm would divide on every hop;
    the caller sums with the collective and scales the result once.
    """
    result = as_reduce_op(op)
    if result is ReduceOp.AVERAGE:
        raise ValueError(
            "op=Average is not a collective operator: all-reduce with op='sum' and divide "
            "the result by comm.Get_size()"
        )
    return result


def reduction_ufunc(op: object) -> np.ufunc:
    """The numpy ufunc that combines two blocks for ``op`` (sum, min, max, product)."""
    return _UFUNCS[as_collective_op(op)]


def reduce_into(accumulator: np.ndarray, incoming: np.ndarray, ufunc: np.ufunc) -> None:
    """Combine ``incoming`` into ``accumulator`` in place: ``accumulator = ufunc(acc, in)``.
    A float16 sum goes through the native kernel (numpy's float16 add costs about 70 ns an
    element): the same value, only a NaN's payload may come from the other operand."""
    if not accumulator.size:
        return
    if (ufunc is np.add and isinstance(accumulator, np.ndarray)
            and isinstance(incoming, np.ndarray) and accumulator.dtype == np.float16
            and incoming.dtype == np.float16 and kernels.available()):
        kernels.float16_add_(incoming, accumulator)
        return
    ufunc(accumulator, incoming, out=accumulator)
