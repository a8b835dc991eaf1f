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
from dlcomm.basics import local_rank, local_size, rank, state
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
                      process_set: ProcessSet, prescale: float = 1.0,
                      postscale: float = 1.0) -> tf.IndexedSlices:
    """Sparse gradients, as Horovod: all-gather indices and values (sum); divide for Average.
    Other ops and pre/postscale factors raise NotImplementedError, as in Horovod."""
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise NotImplementedError(f"a tf.IndexedSlices can be reduced with Sum or Average "
                                  f"only (it is all-gathered), got {op!r}")
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError("prescale_factor/postscale_factor are not supported for a "
                                  "tf.IndexedSlices (it is all-gathered); scale its values")
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
        return _allreduce_sparse(tensor, name, op, process_set, float(prescale_factor),
                                 float(postscale_factor))
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
                      process_set: ProcessSet = global_process_set
                      ) -> list[tf.Tensor | tf.IndexedSlices]:
    """All-reduce several tensors negotiated and fused as one request (one dtype). A
    ``tf.IndexedSlices`` among them is all-gathered on its own, as ``allreduce`` does."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    op = _op(average, op)
    _check_process_set(process_set)
    pre, post = float(prescale_factor), float(postscale_factor)
    req = collective_name("grouped_allreduce", name)
    results: list[Any] = [None] * len(tensors)
    dense = []
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = _allreduce_sparse(t, None if req is None else f"{req}.sparse.{i}", op,
                                           process_set, pre, post)
        else:
            dense.append(i)
    if not dense:
        return results
    ts = [as_tensor(tensors[i], f"tensors[{i}]", reducible=True) for i in dense]
    tensor_compressor, engine_compressor = split(compression)
    packed, ctxs = zip(*(tensor_compressor.compress(t) for t in ts))
    dtypes = {p.dtype for p in packed}
    if len(dtypes) > 1:
        raise ValueError(f"grouped tensors must share one dtype, got "
                         f"{sorted(d.name for d in dtypes)}")
    outs = _grouped_allreduce_dense(list(packed), req, op, pre, post, process_set,
                                    engine_compressor)
    for i, o, c in zip(dense, outs, ctxs):
        results[i] = tensor_compressor.decompress(o, c)
    return results


def _grouped_allreduce_dense(tensors: list[tf.Tensor], req: str | None, op: ReduceOp,
                             pre: float, post: float, process_set: ProcessSet,
                             engine_compressor: Any) -> list[tf.Tensor]:
    def run(*xs: tf.Tensor) -> list[tf.Tensor]:
        def fn(arrays: list[np.ndarray]) -> list[np.ndarray]:
            return core.grouped_allreduce(arrays, req, op, pre, post, process_set) \
                if engine_compressor is None else core.grouped_allreduce_async(
                    arrays, req, op, pre, post, process_set,
                    compression=engine_compressor).wait()
        return call_core(fn, list(xs), [x.dtype for x in xs], [x.shape for x in xs])

    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE) or not tensors[0].dtype.is_floating:
        return run(*tensors)

    @tf.custom_gradient
    def differentiable(*xs: tf.Tensor) -> Any:
        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:  # the same grouped reduction
            return _grouped_allreduce_dense(_as_output_dtypes(dys, xs),
                                            collective_name("grouped_allreduce", None), op,
                                            pre, post, process_set, None)
        return run(*xs), grad

    return differentiable(*tensors)


# --- other collectives: backward passes follow Horovod's conventions (docs/compatibility.md) --
def _my_rows(grads: list[tf.Tensor], inputs: list[tf.Tensor],
             process_set: ProcessSet) -> list[tf.Tensor]:
    """This rank's rows of each gradient of an all-gather, averaged over ranks (Horovod)."""
    averaged = [_allreduce_dense(tf.convert_to_tensor(g), None, Average, 1.0, 1.0,
                                 process_set, None) for g in grads]
    mine = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in inputs])[None, :]
    rows = allgather(mine, process_set=process_set)  # (ranks, tensors)
    starts = tf.reduce_sum(rows[:process_set.rank()], axis=0)
    return [g[starts[i]:starts[i] + tf.shape(x, out_type=tf.int64)[0]]
            for i, (g, x) in enumerate(zip(averaged, inputs))]


@not_converted
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's tensor along dimension 0 (sizes may differ). Its gradient is
    this rank's rows of the gradient averaged over ranks, as Horovod's."""
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
            return _my_rows([dy], [x], process_set)[0]
        return run(x), grad

    return differentiable(t)


@not_converted
def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """All-gather several tensors (one dtype) negotiated as one request; returns the list of
    gathered tensors (differentiable as ``allgather``)."""
    _check_process_set(process_set)
    ts = _check_tensor_list(tensors, "grouped_allgather")
    req = collective_name("grouped_allgather", name)
    shapes = [_rows_shape(t) for t in ts]

    def run(*xs: tf.Tensor) -> list[tf.Tensor]:
        return call_core(lambda a: core.grouped_allgather(a, req, process_set), list(xs),
                         [x.dtype for x in xs], shapes)

    if not ts[0].dtype.is_floating:
        return run(*ts)

    @tf.custom_gradient
    def differentiable(*xs: tf.Tensor) -> Any:
        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return _my_rows(_as_output_dtypes(dys, xs), list(xs), process_set)
        return run(*xs), grad

    return differentiable(*ts)


def _as_output_dtypes(dys: Sequence[Any], xs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """A grouped op's incoming gradients in its tensors' dtype. TensorFlow fills the
    gradient of an output the loss does not reach with zeros of that output's dtype, but
    passes a given ``output_gradients`` as it is (float32 for a float64 tensor in Horovod's
    grouped gradient tests): one group must hold one dtype."""
    return [tf.cast(tf.convert_to_tensor(d), x.dtype) for d, x in zip(dys, xs)]


def _check_tensor_list(tensors: Any, call: str, reducible: bool = False) -> list[tf.Tensor]:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{call} needs at least one tensor")
    ts = [as_tensor(t, f"tensors[{i}]", reducible=reducible) for i, t in enumerate(tensors)]
    if len({t.dtype for t in ts}) > 1:
        raise ValueError(f"grouped tensors must share one dtype, got "
                         f"{sorted({t.dtype.name for t in ts})}")
    return ts


@not_converted
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return ``root_rank``'s tensor on every rank (``root_rank``: a world rank). Its gradient
    is, on the root, the gradient averaged over ranks, zeros elsewhere, as Horovod's."""
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
        def grad(dy: tf.Tensor) -> tf.Tensor:
            averaged = _allreduce_dense(tf.convert_to_tensor(dy), None, Average, 1.0, 1.0,
                                        process_set, None)
            if rank() == root:
                return averaged
            # In a graph, tf.zeros_like of a fully defined shape is a constant that does not
            # depend on ``averaged``: the all-reduce would then run on the root only and
            # wait forever for the others (Horovod's test_horovod_broadcast_grad_cpu).
            with tf.control_dependencies([averaged]):
                return tf.zeros_like(averaged)
        return run(x), grad

    return differentiable(t)


@not_converted
def broadcast_(variables: Any, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> Any:
    """Overwrite each variable with ``root_rank``'s value, in place; returns the variables
    (a list, or the one variable given)."""
    single = hasattr(variables, "assign")
    vs = [variables] if single else list(variables)
    for i, v in enumerate(vs):
        if not hasattr(v, "assign"):
            raise TypeError(f"variables[{i}] is a {type(v).__name__}, not a variable")
    base = collective_name("broadcast_", name)
    assigned = [v.assign(broadcast(tf.convert_to_tensor(v), root_rank,
                                   name=None if base is None else f"{base}.{i}",
                                   process_set=process_set))
                for i, v in enumerate(vs)]
    if tf.executing_eagerly():
        return variables if single else vs
    # In a graph nothing runs unless asked for: return what runs the assignments (their
    # values, as Horovod returns its in-place op's outputs), not the variables.
    return assigned[0] if single else assigned


@not_converted
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             ignore_name_scope: bool = False, process_set: ProcessSet = global_process_set
             ) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
    """Send ``splits[j]`` rows to rank j (an even split without ``splits``). As Horovod:
    returns the rows received, and with ``splits`` given ``(output, received_splits)``. Its
    gradient sends the gradient back the way the rows came."""
    _check_process_set(process_set)
    t = as_tensor(tensor)
    shape = _rows_shape(t)
    req = collective_name("alltoall", name)
    n = process_set.size()
    split_tensor = None
    if splits is not None:
        s = tf.convert_to_tensor(splits)
        if not s.dtype.is_integer:
            raise TypeError(f"splits must be integers, got {s.dtype.name}")
        if s.shape.rank != 1 or (s.shape[0] is not None and s.shape[0] != n):
            raise ValueError(f"splits must be a vector of {n} entries (one per rank), got "
                             f"shape {s.shape}")
        split_tensor = tf.cast(s, tf.int64)

    def run(x: tf.Tensor, sp: tf.Tensor | None, request: str | None) -> list[tf.Tensor]:
        def fn(arrays: list[np.ndarray]) -> list[np.ndarray]:
            out, received = core.alltoall(arrays[0], arrays[1] if len(arrays) > 1 else None,
                                          request, process_set)
            return [out, np.asarray(received, dtype=np.int32)]
        inputs = [x] if sp is None else [x, sp]
        return call_core(fn, inputs, [x.dtype, tf.int32], [shape, tf.TensorShape([n])])

    if t.dtype.is_floating:
        @tf.custom_gradient
        def differentiable(x: tf.Tensor) -> Any:
            out, received = run(x, split_tensor, req)

            def grad(dy: tf.Tensor, *_: Any) -> tf.Tensor:
                back = run(tf.convert_to_tensor(dy), tf.cast(received, tf.int64),
                           collective_name("alltoall", None))[0]
                return back
            return (out, tf.stop_gradient(received)), grad

        out, received = differentiable(t)
    else:
        out, received = run(t, split_tensor, req)
    return out if splits is None else (out, received)


def _scattered_back(grads: list[tf.Tensor], op: ReduceOp, pre: float, post: float,
                    process_set: ProcessSet) -> list[tf.Tensor]:
    """Horovod's gradient of a reduce-scatter: the gradient times the set's size for Sum,
    times the scale factors, all-gathered."""
    factor = (process_set.size() if op is Sum else 1) * pre * post
    scaled = [tf.convert_to_tensor(g) * tf.cast(factor, g.dtype) if factor != 1
              else tf.convert_to_tensor(g) for g in grads]
    return grouped_allgather(scaled, process_set=process_set)


@not_converted
def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none,
                  op: ReduceOp = Average, name: str | None = None,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce over ranks; rank i keeps the i-th part of dimension 0 (differentiable).

    ``compression`` may be ``Compression.none`` or ``fp16`` (a cast); the engine's
    compressors work on all-reduces only.
    """
    return grouped_reducescatter([tensor], device_dense, compression, op, name, process_set,
                                 prescale_factor, postscale_factor, _single=True)[0]


@not_converted
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: Any = Compression.none, op: ReduceOp = Average,
                          name: str | None = None, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0, *,
                          _single: bool = False) -> list[tf.Tensor]:
    """Reduce-scatter several tensors (one dtype) negotiated as one request; returns this
    rank's part of each (differentiable)."""
    _check_process_set(process_set)
    op = as_reduce_op(op)
    ts = _check_tensor_list(tensors, "grouped_reducescatter", reducible=True)
    tensor_compressor, engine_compressor = split(compression)
    if engine_compressor is not None:
        raise ValueError(f"reducescatter takes Compression.none or fp16, not "
                         f"{engine_compressor.describe()!r}")
    packed, ctxs = zip(*(tensor_compressor.compress(t) for t in ts))
    shapes = [_rows_shape(p) for p in packed]
    kind = "reducescatter" if _single else "grouped_reducescatter"
    req = collective_name(kind, name)
    pre, post = float(prescale_factor), float(postscale_factor)

    def run(*xs: tf.Tensor) -> list[tf.Tensor]:
        def fn(arrays: list[np.ndarray]) -> list[np.ndarray]:
            if _single:
                return [core.reducescatter(arrays[0], req, op, process_set, pre, post)]
            return core.grouped_reducescatter(arrays, req, op, process_set, pre, post)
        return call_core(fn, list(xs), [x.dtype for x in xs], shapes)

    if not packed[0].dtype.is_floating:
        outs = run(*packed)
    else:
        @tf.custom_gradient
        def differentiable(*xs: tf.Tensor) -> Any:
            def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
                return _scattered_back(_as_output_dtypes(dys, xs), op, pre, post,
                                       process_set)
            return run(*xs), grad

        outs = differentiable(*packed)
    return [tensor_compressor.decompress(o, c) for o, c in zip(outs, ctxs)]


# --- ranks and sizes as tensors (Horovod's *_op family) -------------------------------------
def rank_op(name: str | None = None) -> tf.Tensor:
    """This rank as an int32 tensor."""
    return tf.constant(rank(), dtype=tf.int32, name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This rank's local rank as an int32 tensor."""
    return tf.constant(local_rank(), dtype=tf.int32, name=name)


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks of a process set (by id; 0: all ranks) as an int32 tensor."""
    return tf.constant(_process_set(process_set_id).size(), dtype=tf.int32, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this host as an int32 tensor."""
    return tf.constant(local_size(), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this rank is a member of the process set (by id), else 0, as an int32 tensor."""
    return tf.constant(int(_process_set(process_set_id).included()), dtype=tf.int32,
                       name=name)


def _process_set(process_set_id: int) -> ProcessSet:
    sets = state().process_sets
    if process_set_id not in sets:
        raise ValueError(f"process set {process_set_id} does not exist (ids: {sorted(sets)})")
    return sets[process_set_id]


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
