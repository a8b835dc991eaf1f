"""``dlcomm.tensorflow.elastic``: Horovod's ``hvd.elastic`` for TensorFlow. ``TensorFlowState``
commits a list of variables, ``TensorFlowKerasState`` a Keras model and its optimizer (with
the dlcomm ``DistributedOptimizer``'s per-rank compression state), both with any picklable
keyword attributes. Keras loads on first use of ``TensorFlowKerasState`` only."""
from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from dlcomm.elastic import HostsUpdatedInterrupt, ObjectState, PeerLostError, State, run
from dlcomm.tensorflow.functions import broadcast_variables

__all__ = ["HostsUpdatedInterrupt", "ObjectState", "PeerLostError", "State",
           "TensorFlowKerasState", "TensorFlowState", "run"]


def _variable_list(variables: Any, what: str) -> list[Any]:
    """``variables`` as a list, each with ``assign`` (``tf.Variable`` or Keras variable)."""
    if isinstance(variables, (tf.Variable, tf.Tensor)) or not isinstance(variables, Iterable):
        raise TypeError(f"{what} must be a list of variables, got {type(variables).__name__}")
    variables = list(variables)
    for i, v in enumerate(variables):
        if not hasattr(v, "assign"):
            raise TypeError(f"{what}[{i}] is a {type(v).__name__}, not a variable")
    return variables


def _values(variables: list[Any]) -> list[np.ndarray]:
    """Copies of the variables' current values (exact, any dtype)."""
    return [np.array(v.numpy(), copy=True) for v in variables]


class TensorFlowState(ObjectState):
    """Elastic state of a TensorFlow job: ``variables`` (a list of ``tf.Variable``) and any
    picklable keyword attributes (``epoch=0``). ``sync()`` gives every rank the values of
    the rank with the most commits."""

    def __init__(self, variables: Iterable[Any] | None = None, **kwargs: Any) -> None:
        self.variables = [] if variables is None else _variable_list(variables, "variables")
        super().__init__(**kwargs)
        self.save()

    def save(self) -> None:
        super().save()
        self._saved_variables = _values(self.variables)

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._saved_variables):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        root = self.sync_root()
        if self.variables:
            broadcast_variables(self.variables, root_rank=root)
        self.sync_objects(root)
        self.save()


def _dlcomm_settings(optimizer: Any) -> Any:
    """The dlcomm ``DistributedOptimizer``'s settings on ``optimizer`` (or on the optimizer a
    ``LossScaleOptimizer`` wraps), None for a plain Keras optimizer."""
    for candidate in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        settings = getattr(candidate, "_dlcomm", None)
        if settings is not None:
            return settings
    return None


class TensorFlowKerasState(ObjectState):
    """Elastic state of a Keras 3 job: ``model``'s variables, ``optimizer``'s (by default
    ``model.optimizer``, looked up when used, so the model may be compiled later) and any
    picklable keyword attributes.

    An optimizer not yet built (Keras builds it on the first step) is built with
    ``model.trainable_variables`` when the state is saved or synced, so every rank
    broadcasts the same variable list and a rollback covers the slots. A dlcomm
    ``DistributedOptimizer``'s compression state (error-feedback residuals, low-rank
    factors) is committed and restored per rank but never broadcast: it differs per rank by
    design, and a rank that joins starts it from zero. With ``backward_passes_per_step > 1``
    the local gradient accumulators are optimizer variables and travel with ``sync()``:
    commit after an applying step, where they are zero."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        import keras  # noqa: PLC0415 - Keras loads with the Keras state only

        if not isinstance(model, keras.Model):
            raise TypeError(f"model must be a keras.Model, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"optimizer must be a keras.optimizers.Optimizer or None, got "
                            f"{type(optimizer).__name__}")
        if not model.variables:
            raise ValueError("the model has no variables yet: build it (keras.Input as its "
                             "first layer, model.build(shape) or one call) before making "
                             "its elastic state")
        self.model, self._optimizer = model, optimizer
        super().__init__(**kwargs)
        self.save()

    @property
    def optimizer(self) -> Any:
        """The optimizer given, else ``model.optimizer`` (None before ``compile``)."""
        if self._optimizer is not None:
            return self._optimizer
        return getattr(self.model, "optimizer", None)

    def _optimizer_variables(self) -> list[Any]:
        """The optimizer's variables, building it first if Keras has not yet."""
        optimizer = self.optimizer
        if optimizer is None:
            return []
        if not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        return list(optimizer.variables)

    def _compressor(self) -> Any:
        settings = None if self.optimizer is None else _dlcomm_settings(self.optimizer)
        return None if settings is None else settings.allreducer.engine_compressor

    def save(self) -> None:
        super().save()
        self._saved_variables = [*self.model.variables, *self._optimizer_variables()]
        self._saved_values = _values(self._saved_variables)
        compressor = self._compressor()
        self._saved_compression = (None if compressor is None
                                   else copy.deepcopy(compressor.state_dict()))

    def restore(self) -> None:
        for variable, value in zip(self._saved_variables, self._saved_values):
            variable.assign(value)
        compressor = self._compressor()
        if compressor is not None:
            if self._saved_compression is None:
                compressor.reset_state()
            else:
                compressor.load_state_dict(copy.deepcopy(self._saved_compression))
        super().restore()

    def sync(self) -> None:
        root = self.sync_root()
        broadcast_variables([*self.model.variables, *self._optimizer_variables()],
                            root_rank=root)
        self.sync_objects(root)
        self.save()
