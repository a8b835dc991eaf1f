"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` returns gradients
averaged over ranks, as ``horovod.tensorflow.DistributedGradientTape`` does, and
``PartialDistributedGradientTape``, whose local layers' gradients stay on each rank (model
parallelism: a layer that differs per rank)."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from dlcomm.ops import Average, ReduceOp
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow.gradient_allreduce import GradientAllreducer
from dlcomm.tensorflow.tensor_bridge import not_converted


class _DistributedGradientTape(tf.GradientTape):
    """Methods copied into a subclass of the wrapped tape's class (see the factory)."""

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient on this rank: ``gradient()`` does not all-reduce it
        (and divides it by the number of ranks with ``scale_local_gradients``, as Horovod)."""
        if not hasattr(source, "shape") or not hasattr(source, "dtype"):
            raise TypeError(f"a local source is a variable or tensor, got "
                            f"{type(source).__name__}")
        self._dlcomm_local_sources[id(source)] = source  # Keras 3 variables have no .ref()

    def _is_local_source(self, source: Any) -> bool:
        return id(source) in self._dlcomm_local_sources

    @not_converted
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        grads = super(self.__class__, self).gradient(target, sources, output_gradients,
                                                     unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = list(tf.nest.flatten(grads, expand_composites=False))
        local = {i for i, s in enumerate(flat_sources) if self._is_local_source(s)}
        shared = [i for i in range(len(flat_sources)) if i not in local]
        reduced = self._dlcomm_allreducer([flat_grads[i] for i in shared],
                                          [flat_sources[i] for i in shared]) if shared else []
        for i, g in zip(shared, reduced):
            flat_grads[i] = g
        if self._dlcomm_scale_local_gradients:
            n = float(self._dlcomm_process_set.size())
            for i in local:
                g = flat_grads[i]
                if g is not None:
                    flat_grads[i] = (tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                                     if isinstance(g, tf.IndexedSlices) else g / n)
        return tf.nest.pack_sequence_as(grads, flat_grads)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None) -> tuple[list, list]:
        """``gradient()``'s results split into (local source, gradient) pairs and the
        all-reduced (source, gradient) pairs, each in the order of ``sources``."""
        flat_sources = tf.nest.flatten(sources)
        grads = tf.nest.flatten(self.gradient(target, sources, output_gradients),
                                expand_composites=False)
        local = [(s, g) for s, g in zip(flat_sources, grads) if self._is_local_source(s)]
        shared = [(s, g) for s, g in zip(flat_sources, grads) if not self._is_local_source(s)]
        return local, shared


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = None,
                            sparse_as_dense: bool = False, op: ReduceOp = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None,
                            process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """Wrap ``gradtape`` so ``gradient()`` all-reduces what it returns (eagerly or in a graph).

    ``compression``: ``Compression.none``/``fp16``, a dlcomm compressor
    (``Compression.lookup("topk:ratio=0.01")`` or its spec string), or None to follow
    ``DLCOMM_COMPRESSION``. ``num_groups``/``groups`` fuse gradients into that many requests
    (or the given lists of variables). ``device_*`` are accepted for Horovod compatibility.
    Sources given to ``register_local_source`` are not all-reduced; with
    ``scale_local_gradients`` their gradients are divided by the number of ranks.
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
    tape._dlcomm_local_sources = {}
    tape._dlcomm_scale_local_gradients = bool(scale_local_gradients)
    tape._dlcomm_process_set = process_set
    return tape


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "", compression: Any = None,
                                   sparse_as_dense: bool = False, op: ReduceOp = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None,
                                   process_set: ProcessSet = global_process_set,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """``DistributedGradientTape`` whose ``local_layers`` (a Keras layer or a list of them)
    keep their trainable weights' gradients on each rank."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, tf.keras.layers.Layer):
        local_layers = [local_layers]
    else:
        local_layers = list(local_layers)
        bad = [type(layer).__name__ for layer in local_layers
               if not isinstance(layer, tf.keras.layers.Layer)]
        if bad:
            raise ValueError(f"local_layers must be Keras layers, got {bad}")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for variable in layer.trainable_weights:
            tape.register_local_source(variable)
    return tape
