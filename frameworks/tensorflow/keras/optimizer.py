"""Keras 3 ``DistributedOptimizer``: gradients are averaged over ranks before they are applied.

Keras 3's ``Model.fit`` (TensorFlow backend) calls ``optimizer.apply_gradients``, which calls
``optimizer.apply(grads, variables)``; user loops call either. The wrapper overrides
``apply``: it all-reduces the gradients (one trip to the core, see ``gradient_allreduce``)
and hands them to the wrapped optimizer's own ``apply``, so clipping, weight decay, loss
scaling and EMA see the averaged gradients, as in Horovod. A ``LossScaleOptimizer`` is
accepted: a flag saying whether this rank's local gradients held an inf/NaN travels in the
same all-reduce as the gradients, and the wrapper's ``check_finite`` fails on every rank when
any rank's flag was set, so all ranks skip the same steps and keep the same scale; a skipped
step also clears the compressor's error-feedback memory, which took in the inf. With
``backward_passes_per_step=N`` gradients are summed locally in optimizer variables and
all-reduced and applied every N-th call only.

A compressor with state (error-feedback residuals, low-rank factors, step counters) keeps it
in Keras checkpoints: ``save_own_variables`` adds it to the optimizer's entry of the weights
store (``model.save``, ``model.save_weights``, ``.keras`` and ``.weights.h5``) as flat arrays
(``dlcomm.compression.state_io``), and ``load_own_variables`` restores it, so a run resumed
from ``model.load_weights`` compresses as the uninterrupted one. Each rank saves its own file
(residuals differ per rank).
"""
from __future__ import annotations

import warnings
from typing import Any

import keras
import tensorflow as tf

from dlcomm.compression.state_io import pack_state, state_keys, unpack_state
from dlcomm.ops import Average, ReduceOp
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow.gradient_allreduce import GradientAllreducer
from dlcomm.tensorflow.tensor_bridge import not_converted


class _Settings:
    """What the wrapper adds to the optimizer (kept off Keras' attribute tracking)."""

    def __init__(self, allreducer: GradientAllreducer, passes: int,
                 average_aggregated: bool) -> None:
        self.allreducer = allreducer
        self.passes = passes
        self.average_aggregated = average_aggregated
        self.accumulators: list[Any] = []
        self.local_step: Any = None
        self.any_rank_overflowed: Any = None  # set while a LossScaleOptimizer applies


class _DistributedOptimizer:
    """Methods copied into a subclass of the wrapped optimizer's class (see the factory)."""

    def build(self, variables: Any) -> None:
        super(self.__class__, self).build(variables)
        s = self._dlcomm
        if s.passes > 1 and not s.accumulators:
            s.accumulators = [self.add_variable_from_reference(v, name="dlcomm_accumulator")
                              for v in variables]
            s.local_step = self.add_variable((), initializer="zeros", dtype="int64",
                                             name="dlcomm_local_step")

    @not_converted
    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        base = super(self.__class__, self)
        s = self._dlcomm
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                raise ValueError("call apply(grads, trainable_variables) the first time, or "
                                 "optimizer.build(trainable_variables) before")
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
        if isinstance(self, keras.optimizers.LossScaleOptimizer):
            return self._apply_agreed_loss_scaling(grads, variables)
        if s.passes == 1:
            return base.apply(s.allreducer(grads, variables), variables)
        if not self.built:
            self.build(variables)
        index = {self._var_key(v): i for i, v in enumerate(self._trainable_variables)}
        accs = [s.accumulators[index[self._var_key(v)]] for v in variables]
        for acc, g in zip(accs, grads):
            if g is not None:
                acc.assign_add(tf.cast(tf.convert_to_tensor(g), acc.dtype))
        s.local_step.assign_add(1)

        def reduce_and_apply() -> tf.Tensor:
            scale = 1.0 / s.passes if s.average_aggregated else 1.0
            summed = [None if g is None else tf.convert_to_tensor(a) * scale
                      for a, g in zip(accs, grads)]
            base.apply(s.allreducer(summed, variables), variables)
            for acc in accs:
                acc.assign(tf.zeros_like(tf.convert_to_tensor(acc)))
            return tf.constant(True)

        tf.cond(tf.equal(tf.math.floormod(tf.convert_to_tensor(s.local_step), s.passes), 0),
                reduce_and_apply, lambda: tf.constant(False))
        return None


    def _apply_agreed_loss_scaling(self, grads: list[Any], variables: list[Any]) -> Any:
        """All-reduce the scaled gradients with one overflow flag fused into the same
        request, so the LossScaleOptimizer skips a step (and halves its scale) on every rank
        when any rank's local gradients held an inf/NaN, even where a compressor drops it."""
        base = super(self.__class__, self)
        s = self._dlcomm
        local_finite = base.check_finite(grads)
        flag = tf.reshape(tf.cast(tf.logical_not(local_finite), tf.float32), [1])
        reduced = s.allreducer([*grads, flag], [*variables, _OVERFLOW_FLAG])
        s.any_rank_overflowed = tf.reduce_any(reduced[-1] > 0)
        if s.allreducer.engine_compressor is not None:
            _reset_memory_on_overflow(s.allreducer.engine_compressor, s.any_rank_overflowed)
        try:
            return base.apply(reduced[:-1], variables)
        finally:
            s.any_rank_overflowed = None

    def check_finite(self, grads: Any) -> Any:
        """The LossScaleOptimizer's check, and false when any rank overflowed this step."""
        finite = super(self.__class__, self).check_finite(grads)
        agreed = getattr(self._dlcomm, "any_rank_overflowed", None)
        return finite if agreed is None else tf.logical_and(finite, tf.logical_not(agreed))


    def save_own_variables(self, store: Any) -> None:
        """The optimizer's variables and, under ``dlcomm_compression``, the compressor's
        state as flat arrays."""
        super(self.__class__, self).save_own_variables(store)
        compressor = self._dlcomm.allreducer.engine_compressor
        if compressor is not None:
            for key, array in pack_state(compressor.state_dict(),
                                         COMPRESSION_STATE_KEY).items():
                store[key] = array

    def load_own_variables(self, store: Any) -> None:
        """Load what ``save_own_variables`` stored. A store without compression state (a
        plain optimizer's) starts the compressor afresh, with a warning."""
        keys = list(store.keys())
        ours = state_keys(keys, COMPRESSION_STATE_KEY)
        own = {k: store[k] for k in keys if k not in ours}
        super(self.__class__, self).load_own_variables(own)
        compressor = self._dlcomm.allreducer.engine_compressor
        if compressor is None:
            if ours:
                warnings.warn("the checkpoint holds compression state, but this optimizer "
                              "does not compress: it is ignored", stacklevel=2)
            return
        if COMPRESSION_STATE_KEY not in ours:
            warnings.warn("the checkpoint holds no compression state (saved by a plain "
                          "optimizer or without compression): error-feedback residuals and "
                          "low-rank factors start from zero", stacklevel=2)
            compressor.reset_state()
            return
        compressor.load_state_dict(unpack_state({k: store[k] for k in ours},
                                                COMPRESSION_STATE_KEY))


COMPRESSION_STATE_KEY = "dlcomm_compression"


def _reset_memory_on_overflow(compressor: Any, overflowed: Any) -> None:
    """Clear the compressor's error-feedback memory on the step every rank skips: the inf
    went into it, and would come back in a later step (as torch's ``LossScaler`` does)."""

    def reset(flag: Any) -> Any:
        if bool(flag):
            compressor.reset_state()
        return flag

    # stateful, so tf.function keeps it; it reads the flag, so it runs after the exchange
    tf.numpy_function(reset, [overflowed], tf.bool, stateful=True)


class _OverflowFlagLabel:
    """Names the overflow flag's slot in the gradient all-reduce (same on every rank)."""

    path = "dlcomm_loss_scale_overflow"


_OVERFLOW_FLAG = _OverflowFlagLabel()


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = None, sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0, op: ReduceOp = Average,
                         backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: ProcessSet = global_process_set
                         ) -> keras.optimizers.Optimizer:
    """A copy of ``optimizer`` (same class and config) that averages gradients over ranks.

    Arguments follow ``horovod.tensorflow.keras.DistributedOptimizer``. ``compression``:
    ``Compression.none``/``fp16``, a dlcomm compressor (``Compression.lookup("topk")`` or a
    spec string) or None for ``DLCOMM_COMPRESSION``. ``backward_passes_per_step`` sums that
    many local gradients before one all-reduce (divided by it when
    ``average_aggregated_gradients``). ``device_*`` are accepted for compatibility.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer must be a keras.optimizers.Optimizer instance, got "
                        f"{type(optimizer).__name__}")
    if (isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            and backward_passes_per_step > 1):
        raise ValueError("a LossScaleOptimizer takes backward_passes_per_step=1 (accumulating "
                         "scaled gradients over passes is not supported)")
    if (isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int)
            or backward_passes_per_step < 1):
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got "
                         f"{backward_passes_per_step!r}")
    if not isinstance(average_aggregated_gradients, bool):
        raise TypeError(f"average_aggregated_gradients must be a bool, got "
                        f"{average_aggregated_gradients!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {type(name).__name__}")
    allreducer = GradientAllreducer(compression, op, gradient_predivide_factor, sparse_as_dense,
                                    num_groups, groups, process_set, prefix="keras")
    if optimizer.built:
        warnings.warn("DistributedOptimizer copies the optimizer from its config: the state "
                      "of this already built optimizer (moments, iterations) is not carried "
                      "over. Wrap the optimizer before training.", stacklevel=2)
    namespace = {k: v for k, v in _DistributedOptimizer.__dict__.items()
                 if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), namespace)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    wrapped = cls.from_config(config)
    wrapped._dlcomm = _Settings(allreducer, backward_passes_per_step,
                                average_aggregated_gradients)
    return wrapped
