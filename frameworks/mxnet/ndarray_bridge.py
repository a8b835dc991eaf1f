"""NDArray <-> numpy for the core: a writable numpy view of a CPU NDArray's own memory.

MXNet's ``asnumpy()`` copies, and numpy 1.26 imports DLPack capsules read-only, so the view
is built from the NDArray's data pointer (``MXNDArrayGetData``) after MXNet's engine has
finished every pending read and write of it (``MXNDArrayWaitToWrite``). The view keeps the
NDArray alive. In-place collectives (``allreduce_``, ``broadcast_``) and the gradients of
``DistributedTrainer``/``DistributedOptimizer`` go through it without a copy; results of
out-of-place calls are new NDArrays (one copy, from the core's result).
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from dlcomm.mxnet.compat import import_mxnet

mx = import_mxnet()
_LIB = mx.base._LIB
_check_call = mx.base.check_call
_CPU_DEVICES = frozenset({"cpu", "cpu_pinned", "cpu_shared"})


class _ArrayOwner:
    """Holds the NDArray while a numpy view of its memory exists (the view's ``base``)."""

    __slots__ = ("__array_interface__", "ndarray")

    def __init__(self, ndarray: Any, pointer: int) -> None:
        self.ndarray = ndarray
        self.__array_interface__ = {
            "data": (pointer, False), "shape": tuple(ndarray.shape),
            "typestr": np.dtype(ndarray.dtype).str, "version": 3,
        }


def check_ndarray(tensor: Any, what: str = "tensor") -> Any:
    """Return ``tensor`` as a dense CPU ``mx.nd.NDArray``; TypeError/ValueError otherwise."""
    if not isinstance(tensor, mx.nd.NDArray):
        raise TypeError(f"{what} must be an mxnet NDArray, got {type(tensor).__name__}")
    if tensor.stype != "default":
        raise ValueError(f"{what} is a sparse NDArray (stype {tensor.stype!r}); pass "
                         "tensor.tostype('default')")
    if tensor.ctx.device_type not in _CPU_DEVICES:
        raise ValueError(f"{what} is on {tensor.ctx}; dlcomm's MXNet adapter moves CPU "
                         "NDArrays only (copy it with tensor.as_in_context(mx.cpu()))")
    if np.dtype(tensor.dtype).names is not None:  # MXNet's bfloat16 is a structured dtype
        raise TypeError(f"{what} has dtype bfloat16, which dlcomm's MXNet adapter does not "
                        "move; cast it with tensor.astype('float32')")
    return tensor


def numpy_view(tensor: Any) -> np.ndarray:
    """A writable numpy array sharing ``tensor``'s memory (waits for MXNet's pending ops)."""
    _check_call(_LIB.MXNDArrayWaitToWrite(tensor.handle))
    if tensor.size == 0:
        return np.empty(tensor.shape, dtype=tensor.dtype)
    pointer = ctypes.c_void_p()
    _check_call(_LIB.MXNDArrayGetData(tensor.handle, ctypes.byref(pointer)))
    if not pointer.value:  # not allocated (should not happen after the wait): copy instead
        return tensor.asnumpy()
    return np.asarray(_ArrayOwner(tensor, pointer.value))


def write_back(tensor: Any, array: np.ndarray) -> Any:
    """Copy ``array`` into ``tensor`` unless it already is the tensor's memory; return tensor."""
    view = numpy_view(tensor)
    if not np.shares_memory(view, array):
        np.copyto(view, np.asarray(array).reshape(view.shape), casting="unsafe")
    return tensor


def new_ndarray(array: np.ndarray, like: Any) -> Any:
    """A new NDArray holding ``array``, on ``like``'s context, of the same kind as ``like``."""
    out = mx.nd.array(array, ctx=like.ctx, dtype=array.dtype)
    if array.ndim == 0:  # mx.nd.array gives 0-d input one dimension
        out = out.reshape(())
    if isinstance(like, mx.np.ndarray):
        out = out.as_np_ndarray()
    return out
