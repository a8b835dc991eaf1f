"""Torch tensors to the core's numpy arrays and back.

A CPU tensor reaches the core as a numpy view of the same memory (no copy); bfloat16, which
numpy lacks, travels as float32 (a copy), as does a non-contiguous tensor.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

import dlcomm
from dlcomm.ops import Average, ReduceOp


def check_tensor(tensor: Any, what: str = "tensor") -> torch.Tensor:
    """``tensor`` if it is a dense CPU tensor, else an error that says what to do."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what} is on {tensor.device}; dlcomm's torch adapter moves CPU tensors "
                         "(GPU tensors go through the NCCL backend, not available in this build)")
    if tensor.is_sparse:
        raise ValueError(f"{what} is sparse; use a dense tensor, sparse_allreduce_async, or "
                         "sparse_as_dense=True in DistributedOptimizer")
    return tensor


def check_tensors(tensors: Any) -> list[torch.Tensor]:
    """A list or tuple of dense CPU tensors."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of torch.Tensor, got {type(tensors).__name__}")
    return [check_tensor(t, f"tensors[{i}]") for i, t in enumerate(tensors)]


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (a copy for bfloat16 or non-contiguous tensors)."""
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()


def write_back(tensor: torch.Tensor, array: np.ndarray) -> torch.Tensor:
    """Copy ``array`` into ``tensor`` unless it already is the tensor's memory."""
    if tensor.dtype != torch.bfloat16 and tensor.is_contiguous():
        view = tensor.detach().numpy()
        if np.shares_memory(view, array):
            return tensor
    with torch.no_grad():
        tensor.copy_(torch.from_numpy(np.ascontiguousarray(array)).reshape(tensor.shape))
    return tensor


def as_tensor(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A tensor on ``array``'s memory, with ``like``'s dtype (bfloat16 comes back a copy)."""
    out = torch.from_numpy(np.ascontiguousarray(array))
    return out.to(like.dtype) if like.dtype == torch.bfloat16 else out


def reduce_op(average: bool | None, op: ReduceOp | None) -> ReduceOp:
    """Horovod's ``average=`` (deprecated) or ``op=``; Average when neither is given."""
    if average is not None and op is not None:
        raise ValueError("give either average= (deprecated) or op=, not both")
    if average is not None:
        return Average if average else dlcomm.Sum
    return Average if op is None else op
