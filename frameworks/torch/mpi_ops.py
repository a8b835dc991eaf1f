"""Collectives on torch tensors, with ``horovod.torch``'s names and meanings.

CPU tensors reach the core as numpy views of the same memory (no copy); in-place variants
(``allreduce_``, ``broadcast_``) reduce straight into the tensor. bfloat16, which numpy
lacks, travels as float32 (a copy). An ``*_async`` call returns the core's ``Handle`` with
the conversion back to a tensor chained by ``then``, so ``poll``/``synchronize`` are the core's.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import dlcomm
from dlcomm import mpi_ops as core
from dlcomm.mpi_ops import Handle, poll, synchronize  # noqa: F401 - one handle for all adapters
from dlcomm.ops import Average, ReduceOp
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.torch.compression import Compression, Compressor


def _check_tensor(tensor: Any, what: str = "tensor") -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what} is on {tensor.device}; dlcomm's torch adapter moves CPU tensors "
                         "(GPU tensors go through the NCCL backend, not available in this build)")
    if tensor.is_sparse:
        raise ValueError(f"{what} is sparse; use a dense tensor (or sparse_as_dense=True in "
                         "DistributedOptimizer)")
    return tensor


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (a copy for bfloat16 or non-contiguous tensors)."""
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()


def _writeback(tensor: torch.Tensor, array: np.ndarray) -> torch.Tensor:
    """Copy ``array`` into ``tensor`` unless it already is the tensor's memory."""
    if tensor.dtype != torch.bfloat16 and tensor.is_contiguous():
        view = tensor.detach().numpy()
        if np.shares_memory(view, array):
            return tensor
    with torch.no_grad():
        tensor.copy_(torch.from_numpy(np.ascontiguousarray(array)).reshape(tensor.shape))
    return tensor


def _as_tensor(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    out = torch.from_numpy(np.ascontiguousarray(array))
    return out.to(like.dtype) if like.dtype == torch.bfloat16 else out


def _op(average: bool | None, op: ReduceOp | None) -> ReduceOp:
    if average is not None and op is not None:
        raise ValueError("give either average= (deprecated) or op=, not both")
    if average is not None:
        return Average if average else dlcomm.Sum
    return Average if op is None else op


# --- all-reduce ------------------------------------------------------------------------------
def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set,
                     compression: Any = None) -> Handle:
    """Start an in-place all-reduce of ``tensor`` (``compression``: a core compressor/spec)."""
    t = _check_tensor(tensor)
    arr = to_numpy(t)
    h = core.allreduce_async(arr, name, _op(average, op), prescale_factor, postscale_factor,
                             process_set, output=arr, compression=compression)
    return h.then(lambda result: _writeback(t, result))


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
    t = _check_tensor(tensor)
    core_compressor = getattr(compression, "core", None)  # dlcomm compressors run in the engine
    compressed, ctx = compression.compress(t)
    arr = to_numpy(compressed)
    h = core.allreduce_async(arr, name, _op(average, op), prescale_factor, postscale_factor,
                             process_set, compression=core_compressor)
    return h.then(lambda result: compression.decompress(_as_tensor(result, compressed), ctx))


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] | Compressor = Compression.none,
              op: ReduceOp | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """All-reduce ``tensor`` and return the result as a new tensor."""
    return allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                           process_set, compression).wait()


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: ReduceOp | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set,
                             compression: Any = None) -> Handle:
    """Start an in-place all-reduce of several tensors, negotiated and fused as one."""
    ts = [_check_tensor(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    arrays = [to_numpy(t) for t in ts]
    h = core.grouped_allreduce_async(arrays, name, _op(average, op), prescale_factor,
                                     postscale_factor, process_set, outputs=arrays,
                                     compression=compression)
    return h.then(lambda results: [_writeback(t, r) for t, r in zip(ts, results)])


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: ReduceOp | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: ReduceOp | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start an all-reduce of several tensors into new tensors."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of torch.Tensor, got {type(tensors).__name__}")
    ts = [_check_tensor(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    arrays = [to_numpy(t) for t in ts]
    h = core.grouped_allreduce_async(arrays, name, _op(average, op), prescale_factor,
                                     postscale_factor, process_set)
    return h.then(lambda results: [_as_tensor(r, t) for t, r in zip(ts, results)])


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, op: ReduceOp | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """All-reduce several tensors together; returns new tensors."""
    return grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                   postscale_factor, process_set).wait()


# --- other collectives -----------------------------------------------------------------------
def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    t = _check_tensor(tensor)
    h = core.allgather_async(to_numpy(t), name, process_set)
    return h.then(lambda result: _as_tensor(result, t))


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's tensor along dimension 0 (sizes may differ)."""
    return allgather_async(tensor, name, process_set).wait()


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Start overwriting ``tensor`` with ``root_rank``'s tensor."""
    t = _check_tensor(tensor)
    arr = to_numpy(t)
    h = core.broadcast_async(arr, root_rank, name, process_set, output=arr)
    return h.then(lambda result: _writeback(t, result))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s tensor, in place."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    t = _check_tensor(tensor)
    h = core.broadcast_async(to_numpy(t), root_rank, name, process_set)
    return h.then(lambda result: _as_tensor(result, t))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return ``root_rank``'s tensor as a new tensor on every rank."""
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def alltoall_async(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None,
                   name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    t = _check_tensor(tensor)
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    h = core.alltoall_async(to_numpy(t), splits, name, process_set)

    def finish(result: tuple[np.ndarray, list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        out, received = result
        return _as_tensor(out, t), torch.tensor(received, dtype=torch.int32)

    return h.then(finish)


def alltoall(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None,
             name: str | None = None, process_set: ProcessSet = global_process_set
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Send ``splits[j]`` rows to rank j; returns ``(output, received_splits)`` as Horovod."""
    return alltoall_async(tensor, splits, name, process_set).wait()


def reducescatter_async(tensor: torch.Tensor, name: str | None = None,
                        op: ReduceOp = Average, process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    t = _check_tensor(tensor)
    h = core.reducescatter_async(to_numpy(t), name, op, process_set, prescale_factor,
                                 postscale_factor)
    return h.then(lambda result: _as_tensor(result, t))


def reducescatter(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce over ranks; rank i keeps the i-th part of dimension 0."""
    return reducescatter_async(tensor, name, op, process_set, prescale_factor,
                               postscale_factor).wait()


def join(device: int = -1) -> int:
    """This rank is out of data; serve others' all-reduces until all join. Returns the last."""
    return core.join(device)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    core.barrier(process_set)
