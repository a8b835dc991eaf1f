"""Summing gradient NDArrays over ranks in place: the step that ``DistributedTrainer`` and
``DistributedOptimizer`` share.

As in Horovod's MXNet adapter, gradients are summed (each divided by
``gradient_predivide_factor`` first) and the average's ``1/size`` is folded into the
optimizer's ``rescale_grad``, so no extra pass over the gradients is spent on it. Every
gradient is submitted before any is waited for, so the engine negotiates and fuses them
together; ``num_groups > 0`` fuses fixed groups explicitly (``grouped_allreduce_``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dlcomm.errors import DLCommError
from dlcomm.mxnet import mpi_ops
from dlcomm.mxnet.compression import Compressor, NoneCompressor, core_compressor
from dlcomm.ops import Sum
from dlcomm.process_sets import ProcessSet


def check_predivide_and_groups(gradient_predivide_factor: Any, num_groups: Any) -> None:
    """Validate the two knobs shared by the trainer and the optimizer."""
    if (isinstance(gradient_predivide_factor, bool)
            or not isinstance(gradient_predivide_factor, (int, float))):
        raise TypeError(f"gradient_predivide_factor must be a number, got "
                        f"{type(gradient_predivide_factor).__name__}")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got "
                         f"{gradient_predivide_factor}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be an int >= 0, got {num_groups!r}")


def _split(items: list[Any], n: int) -> list[list[Any]]:
    """``items`` in ``n`` consecutive chunks of near-equal length (no empty chunk)."""
    n = min(n, len(items))
    size, extra = divmod(len(items), n)
    chunks, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks


def sum_gradients_(named_grads: list[tuple[str, Any, str]], compression: type[Compressor] |
                   Compressor, gradient_predivide_factor: float, num_groups: int,
                   process_set: ProcessSet) -> None:
    """Sum each ``(name, gradient, label)`` over ranks in place; ``label`` names the
    gradient in errors (a parameter name, which may differ across ranks, unlike ``name``)."""
    if process_set.size() == 1 or not named_grads:
        return
    pre = 1.0 / gradient_predivide_factor
    engine_compressor = core_compressor(compression)
    casts = []  # (gradient, sent NDArray, ctx) where compression changed the NDArray
    sent = []
    for name, grad, label in named_grads:
        packed, ctx = compression.compress(grad)
        if packed is not grad:
            casts.append((grad, packed, ctx))
        sent.append((name, packed, label))
    handles: list[tuple[Any, str]] = []
    try:
        if num_groups > 0:
            for chunk in _split(sent, num_groups):
                by_dtype: dict[np.dtype, list[tuple[str, Any, str]]] = {}
                for item in chunk:
                    by_dtype.setdefault(np.dtype(item[1].dtype), []).append(item)
                for group in by_dtype.values():
                    handles.append((mpi_ops.grouped_allreduce_async_(
                        [t for _, t, _ in group], name=f"{group[0][0]}.group{len(group)}",
                        op=Sum, prescale_factor=pre, process_set=process_set,
                        compression=engine_compressor), ", ".join(lb for _, _, lb in group)))
        else:
            for name, t, label in sent:
                handles.append((mpi_ops.allreduce_async_(
                    t, name=name, op=Sum, prescale_factor=pre, process_set=process_set,
                    compression=engine_compressor), label))
    finally:  # wait for whatever was submitted, even when a later submission failed
        first_error: DLCommError | None = None
        for handle, label in handles:
            try:
                handle.wait()
            except DLCommError as exc:
                if first_error is None:
                    first_error = exc
                    first_error.args = (f"{exc} (gradient of {label} on this rank)",)
        if first_error is not None:
            raise first_error
    if compression is not NoneCompressor:
        for grad, packed, ctx in casts:
            grad[:] = compression.decompress(packed, ctx)
