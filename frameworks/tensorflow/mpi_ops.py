"""Collectives on TensorFlow tensors, with ``horovod.tensorflow``'s names and meanings.

Each call works eagerly and inside ``tf.function`` (through ``tensor_bridge.call_core``).
``allreduce`` (Sum/Average), ``allgather`` and ``broadcast`` are differentiable as in
Horovod. ``device_dense``/``device_sparse`` are accepted for compatibility: every tensor goes
through host memory, so they place nothing.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from dlcomm import mpi_ops as core
from dlcomm.basics import rank
from dlcomm.ops import Average, ReduceOp, Sum, as_reduce_op
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow.compression import Compression, split
from dlcomm.tensorflow.tensor_bridge import (
    as_tensor,
    call_core,
    collective_name,
    not_converted,
)


def _op(average: bool | None, op: ReduceOp | None) -> ReduceOp:
    if average is not None and op is not None:
        raise ValueError("give either average= (deprecated) or op=, not both")
    if average is not None:
        return Average if average else Sum
    return Average if op is None else as_reduce_op(op)


def _check_process_set(process_set: ProcessSet) -> ProcessSet:
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a dlcomm.ProcessSet, got "
                        f"{type(process_set).__name__}")
    return process_set


def _rows_shape(tensor: tf.Tensor) -> tf.TensorShape:
    """Output shape of a call that changes only dimension 0 (known only at run time)."""
    if tensor.shape.rank == 0:
        raise ValueError("this collective needs at least one dimension (got a scalar)")
    return tf.TensorShape([None]).concatenate(tensor.shape[1:])


# --- all-reduce ------------------------------------------------------------------------------
def _allreduce_dense(tensor: tf.Tensor, name: str | None, op: ReduceOp, prescale: float,
                     postscale: float, process_set: ProcessSet, engine_compressor: Any
                     ) -> tf.Tensor:
    req = collective_name("allreduce", name)

    def fn(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [core.allreduce(arrays[0], req, op, prescale, postscale, process_set,
                               compression=engine_compressor)]

    def run(x: tf.Tensor) -> tf.Tensor:
        return call_core(fn, [x], [x.dtype], [x.shape])[0]

    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE) or not tensor.dtype.is_floating:
        return run(tensor)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:  # the same (linear) reduction of the gradient
            return _allreduce_dense(tf.convert_to_tensor(dy), None, op, prescale, postscale,
                                    process_set, None)
        return run(x), grad

    return differentiable(tensor)


def _allreduce_sparse(slices: tf.IndexedSlices, name: str | None, op: ReduceOp,
                      process_set: ProcessSet) -> tf.IndexedSlices:
    """Sparse gradients, as Horovod: all-gather indices and values (sum); divide for Average."""
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ValueError(f"a tf.IndexedSlices can be reduced with Sum or Average, got {op!r}")
    base = name or collective_name("allreduce_sparse", None)
    values = allgather(slices.values, name=None if base is None else f"{base}.values",
                       process_set=process_set)
    indices = allgather(slices.indices, name=None if base is None else f"{base}.indices",
                        process_set=process_set)
    if op is Average:
        values = values / tf.cast(process_set.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@not_converted
def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: Any = Compression.none,
              op: ReduceOp | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> tf.Tensor | tf.IndexedSlices:
    """All-reduce ``tensor`` over the process set (default op: Average).

    ``compression``: ``Compression.none``/``fp16`` or a dlcomm compressor
    (``Compression.lookup("topk:ratio=0.01")`` or its spec string). A ``tf.IndexedSlices``
    is all-gathered (Sum or Average), as Horovod does.
    """
    op = _op(average, op)
    _check_process_set(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_sparse(tensor, name, op, process_set)
    t = as_tensor(tensor, reducible=True)
    tensor_compressor, engine_compressor = split(compression)
    if engine_compressor is not None and not t.dtype.is_floating:
        raise TypeError(f"compression {engine_compressor.describe()!r} needs a floating-point "
                        f"tensor, got {t.dtype.name}")
    compressed, ctx = tensor_compressor.compress(t)
    out = _allreduce_dense(compressed, name, op, float(prescale_factor), float(postscale_factor),
                           process_set, engine_compressor)
    return tensor_compressor.decompress(out, ctx)


@not_converted
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: Any = Compression.none, op: ReduceOp | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """All-reduce several tensors negotiated and fused as one request (one dtype)."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    op = _op(average, op)
    _check_process_set(process_set)
    ts = [as_tensor(t, f"tensors[{i}]", reducible=True) for i, t in enumerate(tensors)]
    tensor_compressor, engine_compressor = split(compression)
    packed, ctxs = zip(*(tensor_compressor.compress(t) for t in ts))
    dtypes = {p.dtype for p in packed}
    if len(dtypes) > 1:
        raise ValueError(f"grouped tensors must share one dtype, got "
                         f"{sorted(d.name for d in dtypes)}")
    req = collective_name("grouped_allreduce", name)
    pre, post = float(prescale_factor), float(postscale_factor)

    def fn(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return core.grouped_allreduce_async(arrays, req, op, pre, post, process_set,
                                            compression=engine_compressor).wait()

    outs = call_core(fn, list(packed), [p.dtype for p in packed], [p.shape for p in packed])
    return [tensor_compressor.decompress(o, c) for o, c in zip(outs, ctxs)]


# --- other collectives -----------------------------------------------------------------------
@not_converted
def allgather(tensor: Any, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's tensor along dimension 0 (sizes may differ)."""
    _check_process_set(process_set)
    t = as_tensor(tensor)
    req = collective_name("allgather", name)
    shape = _rows_shape(t)

    def run(x: tf.Tensor) -> tf.Tensor:
        return call_core(lambda a: [core.allgather(a[0], req, process_set)], [x], [x.dtype],
                         [shape])[0]

    if not t.dtype.is_floating:
        return run(t)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            # d(gathered)/d(mine): the sum over ranks of dy, this rank's rows of it
            summed = _allreduce_dense(tf.convert_to_tensor(dy), None, Sum, 1.0, 1.0,
                                      process_set, None)
            rows = allgather(tf.shape(x, out_type=tf.int64)[:1], process_set=process_set)
            start = tf.reduce_sum(rows[:process_set.rank()])
            return summed[start:start + tf.shape(x, out_type=tf.int64)[0]]
        return run(x), grad

    return differentiable(t)


@not_converted
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return ``root_rank``'s tensor on every rank."""
    _check_process_set(process_set)
    root = core.check_root_rank(root_rank, process_set)  # validated now, not when a graph runs
    t = as_tensor(tensor)
    req = collective_name("broadcast", name)

    def run(x: tf.Tensor) -> tf.Tensor:
        return call_core(lambda a: [core.broadcast(a[0], root, req, process_set)], [x],
                         [x.dtype], [x.shape])[0]

    if not t.dtype.is_floating:
        return run(t)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:  # only the root's input reaches the outputs
            summed = _allreduce_dense(tf.convert_to_tensor(dy), None, Sum, 1.0, 1.0,
                                      process_set, None)
            return summed if rank() == root else tf.zeros_like(summed)
        return run(x), grad

    return differentiable(t)


@not_converted
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> tuple[tf.Tensor, tf.Tensor]:
    """Send ``splits[j]`` rows to rank j; returns ``(output, received_splits)`` as Horovod."""
    _check_process_set(process_set)
    t = as_tensor(tensor)
    shape = _rows_shape(t)
    req = collective_name("alltoall", name)
    n = process_set.size()
    inputs = [t]
    if splits is not None:
        s = tf.convert_to_tensor(splits)
        if not s.dtype.is_integer:
            raise TypeError(f"splits must be integers, got {s.dtype.name}")
        if s.shape.rank != 1 or (s.shape[0] is not None and s.shape[0] != n):
            raise ValueError(f"splits must be a vector of {n} entries (one per rank), got "
                             f"shape {s.shape}")
        inputs.append(tf.cast(s, tf.int64))

    def fn(arrays: list[np.ndarray]) -> list[np.ndarray]:
        out, received = core.alltoall(arrays[0], arrays[1] if len(arrays) > 1 else None, req,
                                      process_set)
        return [out, np.asarray(received, dtype=np.int32)]

    out, received = call_core(fn, inputs, [t.dtype, tf.int32], [shape, tf.TensorShape([n])])
    return out, received


@not_converted
def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none,
                  op: ReduceOp = Average, name: str | None = None,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce over ranks; rank i keeps the i-th part of dimension 0.

    ``compression`` may be ``Compression.none`` or ``fp16`` (a cast); the engine's
    compressors work on all-reduces only.
    """
    _check_process_set(process_set)
    op = as_reduce_op(op)
    t = as_tensor(tensor, reducible=True)
    tensor_compressor, engine_compressor = split(compression)
    if engine_compressor is not None:
        raise ValueError(f"reducescatter takes Compression.none or fp16, not "
                         f"{engine_compressor.describe()!r}")
    compressed, ctx = tensor_compressor.compress(t)
    shape = _rows_shape(compressed)
    req = collective_name("reducescatter", name)
    pre, post = float(prescale_factor), float(postscale_factor)

    def fn(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [core.reducescatter(arrays[0], req, op, process_set, pre, post)]

    out = call_core(fn, [compressed], [compressed.dtype], [shape])[0]
    return tensor_compressor.decompress(out, ctx)


@not_converted
def join(device: str = "") -> int | tf.Tensor:
    """This rank is out of data; serve others' all-reduces until all join. Returns the rank
    that joined last (a tensor inside ``tf.function``)."""
    if tf.executing_eagerly():
        return core.join()
    return call_core(lambda a: [np.asarray(core.join(), dtype=np.int32)], [], [tf.int32],
                     [tf.TensorShape([])])[0]


@not_converted
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set reaches the barrier (eagerly or in a graph)."""
    _check_process_set(process_set)
    if tf.executing_eagerly():
        core.barrier(process_set)
        return
    call_core(lambda a: [np.asarray(core.barrier(process_set) or 0, dtype=np.int32)], [],
              [tf.int32], [tf.TensorShape([])])
