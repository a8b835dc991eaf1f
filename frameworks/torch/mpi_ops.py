"""Collectives on torch tensors, with ``horovod.torch``'s names, signatures and return types.

CPU tensors reach the core as numpy views of the same memory (``tensor_bridge``); in-place
variants (``allreduce_``, ``broadcast_``) reduce straight into the tensor. An ``*_async`` call
returns the core's ``Handle`` with the conversion back to a tensor chained by ``then``, so
``poll``/``synchronize`` are the core's. The synchronous out-of-place calls (``allreduce``,
``allgather``, ``broadcast``, ``alltoall``, ``reducescatter`` and the grouped ones) are
differentiable, as Horovod's (``differentiable``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dlcomm import mpi_ops as core
from dlcomm.mpi_ops import Handle, poll, synchronize  # noqa: F401 - one handle for all adapters
from dlcomm.ops import Average, ReduceOp, as_reduce_op
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.torch import differentiable as grad_fn
from dlcomm.torch.compression import Compression, Compressor
from dlcomm.torch.tensor_bridge import (
    as_tensor,
    check_tensor,
    check_tensors,
    reduce_op,
    to_numpy,
    write_back,
)


# --- all-reduce ------------------------------------------------------------------------------
def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set,
                     compression: Any = None) -> Handle:
    """Start an in-place all-reduce of ``tensor`` (``compression``: a core compressor/spec)."""
    t = check_tensor(tensor)
    arr = to_numpy(t)
    h = core.allreduce_async(arr, name, reduce_op(average, op), prescale_factor,
                             postscale_factor, process_set, output=arr, compression=compression)
    return h.then(lambda result: write_back(t, result))


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: ReduceOp | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """All-reduce ``tensor`` in place and return it."""
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set).wait()


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set,
                    compression: type[Compressor] | Compressor = Compression.none) -> Handle:
    """Start an all-reduce into a new tensor (``tensor`` is left unchanged)."""
    t = check_tensor(tensor)
    core_compressor = getattr(compression, "core", None)  # dlcomm compressors run in the engine
    compressed, ctx = compression.compress(t)
    h = core.allreduce_async(to_numpy(compressed), name, reduce_op(average, op),
                             prescale_factor, postscale_factor, process_set,
                             compression=core_compressor)
    return h.then(lambda result: compression.decompress(as_tensor(result, compressed), ctx))


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] | Compressor = Compression.none,
              op: ReduceOp | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """All-reduce ``tensor`` and return the result as a new tensor (differentiable)."""
    t = check_tensor(tensor)
    compressed, ctx = compression.compress(t)
    out = grad_fn.AllreduceFunction.apply(compressed, name, reduce_op(average, op),
                                          prescale_factor, postscale_factor, process_set,
                                          getattr(compression, "core", None))
    return compression.decompress(out, ctx)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: ReduceOp | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set,
                             compression: Any = None) -> Handle:
    """Start an in-place all-reduce of several tensors, negotiated and fused as one."""
    ts = check_tensors(tensors)
    arrays = [to_numpy(t) for t in ts]
    h = core.grouped_allreduce_async(arrays, name, reduce_op(average, op), prescale_factor,
                                     postscale_factor, process_set, outputs=arrays,
                                     compression=compression)
    return h.then(lambda results: [write_back(t, r) for t, r in zip(ts, results)])


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: ReduceOp | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """All-reduce several tensors together, in place; returns them."""
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: ReduceOp | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start an all-reduce of several tensors into new tensors."""
    ts = check_tensors(tensors)
    h = core.grouped_allreduce_async([to_numpy(t) for t in ts], name, reduce_op(average, op),
                                     prescale_factor, postscale_factor, process_set)
    return h.then(lambda results: [as_tensor(r, t) for t, r in zip(ts, results)])


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None,
                      compression: type[Compressor] | Compressor = Compression.none,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """All-reduce several tensors together; returns new tensors (differentiable)."""
    ts = check_tensors(tensors)
    packed, ctxs = zip(*(compression.compress(t) for t in ts)) if ts else ((), ())
    outs = grad_fn.GroupedAllreduceFunction.apply(name, reduce_op(average, op),
                                                  prescale_factor, postscale_factor,
                                                  process_set, *packed)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None, op: ReduceOp,
                           process_set: ProcessSet = global_process_set) -> Handle:
    """Start reducing a sparse COO tensor as Horovod does: all-gather its indices and values
    (a sum; Average divides by the process set's size). The handle's result is a sparse
    tensor; calling the handle waits for it, as Horovod's returned function does."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError(f"sparse_allreduce_async takes a sparse COO tensor, got "
                        f"{type(tensor).__name__}"
                        + ("" if not isinstance(tensor, torch.Tensor) else " (dense)"))
    op = as_reduce_op(op)
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ValueError(f"sparse tensors are reduced with Sum or Average, got {op!r}")
    t = tensor.coalesce()
    base = name or core._auto_name("sparse_allreduce", process_set.process_set_id)
    values = allgather_async(t.values(), name=f"{base}.values", process_set=process_set)
    indices = allgather_async(t.indices().t().contiguous(), name=f"{base}.indices",
                              process_set=process_set)

    def combine(all_indices: torch.Tensor) -> torch.Tensor:
        all_values = values.wait()
        if op is Average:
            all_values = all_values / process_set.size()
        return torch.sparse_coo_tensor(all_indices.t(), all_values, t.shape)

    return indices.then(combine)


# --- all-gather --------------------------------------------------------------------------------
def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start concatenating every rank's tensor along dimension 0."""
    t = check_tensor(tensor)
    h = core.allgather_async(to_numpy(t), name, process_set)
    return h.then(lambda result: as_tensor(result, t))


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's tensor along dimension 0 (sizes may differ; differentiable)."""
    return grad_fn.AllgatherFunction.apply(check_tensor(tensor), name, process_set)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start all-gathering several tensors, negotiated as one request."""
    ts = check_tensors(tensors)
    h = core.grouped_allgather_async([to_numpy(t) for t in ts], name, process_set)
    return h.then(lambda results: [as_tensor(r, t) for t, r in zip(ts, results)])


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """All-gather several tensors together; returns new tensors (differentiable)."""
    ts = check_tensors(tensors)
    return list(grad_fn.GroupedAllgatherFunction.apply(name, process_set, *ts))


# --- broadcast ---------------------------------------------------------------------------------
def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Start overwriting ``tensor`` with ``root_rank``'s tensor (a world rank)."""
    t = check_tensor(tensor)
    arr = to_numpy(t)
    h = core.broadcast_async(arr, root_rank, name, process_set, output=arr)
    return h.then(lambda result: write_back(t, result))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s tensor, in place."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start copying ``root_rank``'s tensor into a new tensor on every rank."""
    t = check_tensor(tensor)
    h = core.broadcast_async(to_numpy(t), root_rank, name, process_set)
    return h.then(lambda result: as_tensor(result, t))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return ``root_rank``'s tensor as a new tensor on every rank (differentiable)."""
    return grad_fn.BroadcastFunction.apply(check_tensor(tensor), root_rank, name, process_set)


# --- alltoall ----------------------------------------------------------------------------------
def _splits(splits: Any) -> Any:
    return splits.tolist() if isinstance(splits, torch.Tensor) else splits


def alltoall_async(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None,
                   name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start an alltoall; the handle's result is ``(output, received_splits)``."""
    t = check_tensor(tensor)
    h = core.alltoall_async(to_numpy(t), _splits(splits), name, process_set)

    def finish(result: tuple[np.ndarray, list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        out, received = result
        return as_tensor(out, t), torch.tensor(received, dtype=torch.int32)

    return h.then(finish)


def alltoall(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None,
             name: str | None = None, process_set: ProcessSet = global_process_set
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Send ``splits[j]`` rows to rank j (an even split without ``splits``). As Horovod:
    returns the rows received, and with ``splits`` given ``(output, received_splits)``
    (differentiable)."""
    out, received = grad_fn.AlltoallFunction.apply(check_tensor(tensor), _splits(splits),
                                                   name, process_set)
    return out if splits is None else (out, received)


# --- reduce-scatter ----------------------------------------------------------------------------
def reducescatter_async(tensor: torch.Tensor, name: str | None = None,
                        op: ReduceOp = Average, process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start a reduce-scatter: rank i keeps the i-th part of dimension 0."""
    t = check_tensor(tensor)
    h = core.reducescatter_async(to_numpy(t), name, op, process_set, prescale_factor,
                                 postscale_factor)
    return h.then(lambda result: as_tensor(result, t))


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] | Compressor = Compression.none,
                  op: ReduceOp = Average, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce over ranks; rank i keeps the i-th part of dimension 0 (differentiable;
    ``compression``: ``Compression.none`` or ``fp16``, a cast)."""
    t = check_tensor(tensor)
    compressed, ctx = compression.compress(t)
    out = grad_fn.ReducescatterFunction.apply(compressed, name, as_reduce_op(op), process_set,
                                              prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: ReduceOp = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Start reduce-scattering several tensors, negotiated as one request."""
    ts = check_tensors(tensors)
    h = core.grouped_reducescatter_async([to_numpy(t) for t in ts], name, op, process_set,
                                         prescale_factor, postscale_factor)
    return h.then(lambda results: [as_tensor(r, t) for t, r in zip(ts, results)])


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] | Compressor = Compression.none,
                          op: ReduceOp = Average, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reduce-scatter several tensors together; returns this rank's parts (differentiable)."""
    ts = check_tensors(tensors)
    packed, ctxs = zip(*(compression.compress(t) for t in ts)) if ts else ((), ())
    outs = grad_fn.GroupedReducescatterFunction.apply(name, as_reduce_op(op), process_set,
                                                      prescale_factor, postscale_factor,
                                                      *packed)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


# --- synchronisation -------------------------------------------------------------------------
def join(device: int = -1) -> int:
    """This rank is out of data; serve others' all-reduces until all join. Returns the last."""
    return core.join(device)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set reaches the barrier."""
    core.barrier(process_set)
