"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` returns gradients
averaged over ranks, as ``horovod.tensorflow.DistributedGradientTape`` does."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from dlcomm.ops import Average, ReduceOp
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow.gradient_allreduce import GradientAllreducer
from dlcomm.tensorflow.tensor_bridge import not_converted


class _DistributedGradientTape(tf.GradientTape):
    """Methods copied into a subclass of the wrapped tape's class (see the factory)."""

    @not_converted
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        grads = super(self.__class__, self).gradient(target, sources, output_gradients,
                                                     unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        reduced = self._dlcomm_allreducer(flat_grads, flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = None,
                            sparse_as_dense: bool = False, op: ReduceOp = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None,
                            process_set: ProcessSet = global_process_set) -> tf.GradientTape:
    """Wrap ``gradtape`` so ``gradient()`` all-reduces what it returns (eagerly or in a graph).

    ``compression``: ``Compression.none``/``fp16``, a dlcomm compressor
    (``Compression.lookup("topk:ratio=0.01")`` or its spec string), or None to follow
    ``DLCOMM_COMPRESSION``. ``num_groups``/``groups`` fuse gradients into that many requests
    (or the given lists of variables). ``device_*`` are accepted for Horovod compatibility.
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"gradtape must be a tf.GradientTape, got {type(gradtape).__name__}")
    allreducer = GradientAllreducer(compression, op, gradient_predivide_factor, sparse_as_dense,
                                    num_groups, groups, process_set, prefix="tape")
    namespace = {k: v for k, v in _DistributedGradientTape.__dict__.items()
                 if k not in ("__dict__", "__weakref__")}
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), namespace)
    tape = object.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recording: the user's tape lives on
    tape._dlcomm_allreducer = allreducer
    return tape
