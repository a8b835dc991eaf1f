"""Broadcasting variables and Python objects from one rank to all."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from dlcomm import functions as core_functions
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow import mpi_ops
from dlcomm.tensorflow.tensor_bridge import not_converted


def _variable_name(variable: Any, index: int) -> str:
    """A name for a variable's broadcast, equal on every rank that builds the same model."""
    label = getattr(variable, "path", None)
    if label is None:
        try:
            label = variable.name
        except (AttributeError, ValueError):
            label = "var"
    return f"broadcast.variable.{index}.{label}"


@not_converted
def broadcast_variables(variables: Iterable[Any], root_rank: int = 0,
                        process_set: ProcessSet = global_process_set) -> None:
    """Overwrite each variable (``tf.Variable`` or Keras variable) with ``root_rank``'s value.

    Works eagerly and inside ``tf.function``. Pass ``model.variables`` (and
    ``optimizer.variables`` once the optimizer is built) after creating the model.
    """
    if isinstance(variables, (tf.Variable, tf.Tensor)) or not isinstance(variables, Iterable):
        raise TypeError(f"variables must be a list of variables, got "
                        f"{type(variables).__name__}")
    variables = list(variables)
    for i, v in enumerate(variables):
        if not hasattr(v, "assign"):
            raise TypeError(f"variables[{i}] is a {type(v).__name__}, not a variable")
    for i, v in enumerate(variables):
        value = mpi_ops.broadcast(tf.convert_to_tensor(v), root_rank,
                                  name=_variable_name(v, i), process_set=process_set)
        v.assign(value)


def broadcast_global_variables(root_rank: int = 0,
                               process_set: ProcessSet = global_process_set) -> Any:
    """TensorFlow 1 graphs: an op that sets every global variable to ``root_rank``'s value
    (run it in the session after initialising the variables). Eagerly there are no global
    variables, so this raises RuntimeError, as Horovod does."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "broadcast_global_variables() works in a TensorFlow 1 graph only; eagerly, call "
            "broadcast_variables(model.variables, root_rank) (and the optimizer's variables)")
    variables = tf.compat.v1.global_variables()
    return tf.group(*[
        v.assign(mpi_ops.broadcast(tf.convert_to_tensor(v), root_rank,
                                   name=_variable_name(v, i), process_set=process_set))
        for i, v in enumerate(variables)])


def _executing_eagerly() -> bool:
    """Whether ops run eagerly here (Horovod's module exposes it; its tests call it)."""
    return tf.executing_eagerly()


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return root's (picklable) object on every rank (eager only; ``session`` is TF1's)."""
    if session is not None:
        raise ValueError("session= is a TensorFlow 1 argument; dlcomm.tensorflow runs TF 2 "
                         "(eager), leave it None")
    return core_functions.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return every rank's (picklable) object, in rank order (eager only)."""
    if session is not None:
        raise ValueError("session= is a TensorFlow 1 argument; dlcomm.tensorflow runs TF 2 "
                         "(eager), leave it None")
    return core_functions.allgather_object(obj, name, process_set)
