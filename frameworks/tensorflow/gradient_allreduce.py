"""All-reduce a list of gradients in one trip to the core: what ``DistributedGradientTape``
and the Keras ``DistributedOptimizer`` share.

All dense gradients cross into Python together (one ``tf.numpy_function`` in a graph), are
submitted to the engine at once (so it negotiates and fuses them, or the explicit groups, as
it does for torch) and are waited for together. Names come from the variables, so a
compressor's residuals stay with their variable from step to step.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from dlcomm import mpi_ops as core
from dlcomm.ops import Average, ReduceOp, Sum, as_reduce_op
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow import mpi_ops
from dlcomm.tensorflow.compression import CoreCompressor, resolve
from dlcomm.tensorflow.tensor_bridge import as_tensor, call_core, not_converted


def variable_label(variable: Any, index: int) -> str:
    """``<index>.<path or name>``: unique, and equal on ranks that build the same model."""
    label = getattr(variable, "path", None)
    if label is None:
        try:
            label = variable.name
        except (AttributeError, ValueError):  # eager tensors have no name
            label = "tensor"
    return f"{index}.{label}"


class GradientAllreducer:
    """Averages (or sums) gradients over ranks; validated once, called every step."""

    def __init__(self, compression: Any = None, op: ReduceOp = Average,
                 gradient_predivide_factor: float = 1.0, sparse_as_dense: bool = False,
                 num_groups: int = 0, groups: Any = None,
                 process_set: ProcessSet = global_process_set, prefix: str = "grad") -> None:
        op = as_reduce_op(op)
        if op not in (Average, Sum):
            raise ValueError(f"gradients are averaged or summed; op={op!r} is not meaningful")
        if isinstance(gradient_predivide_factor, bool) or not isinstance(
                gradient_predivide_factor, (int, float)) or gradient_predivide_factor <= 0:
            raise ValueError(f"gradient_predivide_factor must be a number > 0, got "
                             f"{gradient_predivide_factor!r}")
        if gradient_predivide_factor != 1.0 and op is not Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        if not isinstance(sparse_as_dense, bool):
            raise TypeError(f"sparse_as_dense must be a bool, got {sparse_as_dense!r}")
        if not isinstance(process_set, ProcessSet):
            raise TypeError(f"process_set must be a dlcomm.ProcessSet, got "
                            f"{type(process_set).__name__}")
        if groups is not None and num_groups:
            raise ValueError("give num_groups or groups, not both")
        if isinstance(groups, int) and not isinstance(groups, bool):  # Horovod's older meaning
            num_groups, groups = groups, None
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
            raise ValueError(f"num_groups must be an int >= 0, got {num_groups!r}")
        if groups is not None:
            groups = [list(g) for g in groups]
            if not all(hasattr(v, "assign") for g in groups for v in g):
                raise ValueError("groups must be a list of lists of variables")
        self.compression = resolve(compression)
        self.engine_compressor = (self.compression.core
                                  if isinstance(self.compression, CoreCompressor) else None)
        self.op = op
        self.predivide = float(gradient_predivide_factor)
        self.sparse_as_dense = sparse_as_dense
        self.num_groups = num_groups
        self.groups = groups
        self.process_set = process_set
        self.prefix = prefix

    def _buckets(self, dense: list[int], variables: Sequence[Any]) -> list[list[int]]:
        """Positions of the dense gradients, grouped into fused requests."""
        if self.groups is not None:
            where = {}
            for gi, group in enumerate(self.groups):
                for v in group:
                    if id(v) in where:
                        raise ValueError(f"variable {variable_label(v, gi)} appears in two "
                                         "groups")
                    where[id(v)] = gi
            by_group: dict[int, list[int]] = {}
            singles = []
            for i in dense:
                gi = where.get(id(variables[i]))
                if gi is None:
                    singles.append([i])
                else:
                    by_group.setdefault(gi, []).append(i)
            return [by_group[g] for g in sorted(by_group)] + singles
        if not self.num_groups:
            return [[i] for i in dense]
        n = min(self.num_groups, len(dense))
        size, extra = divmod(len(dense), n)
        out, start = [], 0
        for b in range(n):
            end = start + size + (1 if b < extra else 0)
            out.append(dense[start:end])
            start = end
        return out

    @not_converted
    def __call__(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """The reduced gradients, in order; ``None`` gradients stay ``None``."""
        grads = list(grads)
        if len(grads) != len(variables):
            raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
        labels = [variable_label(v, i) for i, v in enumerate(variables)]
        out: list[Any] = [None] * len(grads)
        dense: list[int] = []
        tensors: dict[int, tf.Tensor] = {}
        for i, g in enumerate(grads):
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    if self.engine_compressor is not None:
                        raise ValueError(f"gradient of {labels[i]} is sparse; compression "
                                         "needs sparse_as_dense=True")
                    out[i] = mpi_ops.allreduce(g, op=self.op, name=f"{self.prefix}.{labels[i]}",
                                               process_set=self.process_set)
                    continue
                g = tf.convert_to_tensor(g)
            tensors[i] = as_tensor(g, f"gradient of {labels[i]}", reducible=True)
            dense.append(i)
        if not dense:
            return out
        packed, ctxs = {}, {}
        for i in dense:
            packed[i], ctxs[i] = self.compression.compress(tensors[i])
        # grouped requests need one dtype: split a bucket by dtype
        buckets = []
        for bucket in self._buckets(dense, variables):
            by_dtype: dict[Any, list[int]] = {}
            for i in bucket:
                by_dtype.setdefault(packed[i].dtype, []).append(i)
            buckets.extend(by_dtype.values())
        order = [i for b in buckets for i in b]
        names = [f"{self.prefix}.{labels[b[0]]}" if len(b) == 1
                 else f"{self.prefix}.group.{labels[b[0]]}" for b in buckets]
        pre, post = ((1.0 / self.predivide, self.predivide) if self.op is Average
                     else (1.0, 1.0))
        op, process_set, compressor = self.op, self.process_set, self.engine_compressor
        sizes = [len(b) for b in buckets]

        def fn(arrays: list[np.ndarray]) -> list[np.ndarray]:
            handles, start = [], 0
            for name, n in zip(names, sizes):
                part = arrays[start:start + n]
                start += n
                if n == 1:
                    handles.append(core.allreduce_async(part[0], name, op, pre, post,
                                                        process_set, compression=compressor))
                else:
                    handles.append(core.grouped_allreduce_async(
                        part, name, op, pre, post, process_set, compression=compressor))
            results: list[np.ndarray] = []
            for h, n in zip(handles, sizes):
                r = h.wait()
                results.extend([r] if n == 1 else r)
            return results

        reduced = call_core(fn, [packed[i] for i in order], [packed[i].dtype for i in order],
                            [packed[i].shape for i in order])
        for i, r in zip(order, reduced):
            out[i] = self.compression.decompress(r, ctxs[i])
        return out
