"""How a TensorFlow tensor reaches the numpy core, eagerly and from inside ``tf.function``.

Eagerly, a tensor's host buffer is handed to the core as a numpy array and the result wrapped
back as a tensor. In a graph (``tf.function``, Keras ``fit``) the same Python code runs as one
``tf.numpy_function`` op: TensorFlow calls back into Python with numpy arrays when the op
executes. That costs a host copy per tensor and the GIL, and the graph cannot overlap the
collective with other ops (see docs/tensorflow.md). ``numpy_function`` ops are stateful, so
``tf.function``'s automatic control dependencies run them in program order on every rank; in
a TF1 graph (``tf.compat.v1`` sessions) the adapter chains them in the order they were built.
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from dlcomm.errors import MismatchError

# dtypes the core moves (the reducible ones plus bool); bfloat16 travels as float32
_MOVABLE = (tf.int8, tf.uint8, tf.int16, tf.uint16, tf.int32, tf.uint32, tf.int64, tf.uint64,
            tf.float16, tf.float32, tf.float64, tf.bool)
_REDUCIBLE = tuple(d for d in _MOVABLE if d != tf.bool)
_graph_counters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_graph_labels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_graph_numbers = itertools.count()
_last_collective: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# The adapter's Python runs as is inside tf.function: its branches are on Python values.
not_converted = tf.autograph.experimental.do_not_convert


def as_tensor(value: Any, what: str = "tensor", reducible: bool = False) -> tf.Tensor:
    """``value`` as a tf.Tensor of a dtype the core can move; TypeError naming the problem."""
    if isinstance(value, tf.IndexedSlices):
        raise TypeError(f"{what} is a tf.IndexedSlices; only allreduce takes sparse gradients "
                        "(or pass sparse_as_dense=True)")
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a tf.Tensor, a tf.Variable or convertible to one, "
                        f"got {type(value).__name__}: {exc}") from None
    allowed = _REDUCIBLE if reducible else _MOVABLE
    if tensor.dtype != tf.bfloat16 and tensor.dtype not in allowed:
        names = ", ".join(sorted(d.name for d in allowed))
        raise TypeError(f"{what} has dtype {tensor.dtype.name}, which dlcomm cannot "
                        f"{'reduce' if reducible else 'move'}; supported: {names}, bfloat16")
    return tensor


class TensorMismatchError(MismatchError, tf.errors.FailedPreconditionError):
    """Ranks disagree on a collective (shape, dtype, op, root): dlcomm's ``MismatchError``
    and, as Horovod raises for it, TensorFlow's ``FailedPreconditionError``."""

    def __init__(self, message: str) -> None:
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class TensorArgumentError(ValueError, tf.errors.InvalidArgumentError):
    """An argument the collective cannot take (rows an even alltoall cannot split, splits
    that do not add up): dlcomm's ``ValueError`` and, as Horovod raises for it,
    TensorFlow's ``InvalidArgumentError``."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


def call_core(fn: Callable[[list[np.ndarray]], Sequence[np.ndarray]],
              inputs: Sequence[tf.Tensor], out_dtypes: Sequence[tf.DType],
              out_shapes: Sequence[Any]) -> list[tf.Tensor]:
    """Run ``fn`` (numpy arrays in, numpy arrays out) on ``inputs``.

    Eagerly it is a plain call; in a graph it becomes one ``tf.numpy_function`` op whose
    outputs get ``out_shapes`` (a ``None`` dimension where the size is only known at run
    time). bfloat16 tensors are cast to float32 for the core and back after.
    """
    wire = [tf.float32 if t.dtype == tf.bfloat16 else t.dtype for t in inputs]
    casted = [tf.cast(t, w) if t.dtype != w else t for t, w in zip(inputs, wire)]
    wire_out = [tf.float32 if d == tf.bfloat16 else d for d in out_dtypes]

    def body(*arrays: np.ndarray) -> list[np.ndarray]:
        results = fn([np.asarray(a) for a in arrays])
        return [np.asarray(r, dtype=d.as_numpy_dtype) for r, d in zip(results, wire_out)]

    if tf.executing_eagerly():
        try:
            results = body(*[t.numpy() for t in casted])
        except MismatchError as exc:  # in a graph, TensorFlow reports any error as Unknown
            raise TensorMismatchError(str(exc)) from exc
        except ValueError as exc:
            if type(exc) is not ValueError:  # a subclass says more (UnsupportedOpError, ...)
                raise
            raise TensorArgumentError(str(exc)) from exc
        outs = [tf.convert_to_tensor(r) for r in results]
    else:
        graph = tf.compat.v1.get_default_graph()
        # A TF1 graph (no tf.function) gets no automatic control dependencies: its executor
        # would run independent collectives in a different order on each rank, one at a
        # time (TensorFlow serialises Python ops), and two ranks each blocked in a different
        # collective never finish. Chained in the order they were built, they run in that
        # order everywhere.
        previous = [] if tf.inside_function() else _last_collective.get(graph, [])
        with tf.control_dependencies(previous):
            outs = tf.numpy_function(body, casted, wire_out, stateful=True, name="dlcomm_core")
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        if not tf.inside_function():
            _last_collective[graph] = [outs[0].op]
        for out, shape in zip(outs, out_shapes):
            out.set_shape(shape)
    return [tf.cast(o, d) if o.dtype != d else o for o, d in zip(outs, out_dtypes)]


def collective_name(kind: str, name: str | None) -> str | None:
    """The request name: the user's, or in a graph one fixed when the graph is traced.

    Eagerly ``None`` lets the core number unnamed calls in call order. In a graph the name
    must not depend on run-time order, so it is ``<kind>.<graph name>.<n>`` with ``n`` the
    op's position among this graph's collectives: the same on every rank that traces the
    same function, and the same each time the graph runs.
    """
    if name is not None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str or None, got {name!r}")
        return name
    if tf.executing_eagerly():
        return None
    graph = tf.compat.v1.get_default_graph()
    counter = _graph_counters.setdefault(graph, itertools.count())
    return f"{kind}.{_graph_label(graph)}.{next(counter)}"


def _graph_label(graph: Any) -> str:
    """A ``tf.function``'s graph by its name; a TF1 graph (no name) by the order in which
    this process first built a collective in it, the same on every rank."""
    name = getattr(graph, "name", None)
    if name:
        return name
    label = _graph_labels.get(graph)
    if label is None:
        label = _graph_labels[graph] = f"graph{next(_graph_numbers)}"
    return label
