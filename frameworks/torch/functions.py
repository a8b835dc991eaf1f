"""Broadcasting model and optimizer state, and Python objects, from one rank to all."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from dlcomm import functions as core_functions
from dlcomm.basics import rank
from dlcomm.mpi_ops import check_root_rank
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.torch import mpi_ops
from dlcomm.torch.compression_state import RANK_LOCAL_KEYS


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[Any], root_rank: int = 0,
                         process_set: ProcessSet = global_process_set) -> None:
    """Overwrite parameters (a ``state_dict()`` or ``named_parameters()``) with root's, in place."""
    if isinstance(params, Mapping):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    handles = []
    for i, (name, tensor) in enumerate(items):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"parameter {name or i} is a {type(tensor).__name__}, not a tensor")
        handles.append(mpi_ops.broadcast_async_(
            tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor, root_rank,
            name=f"broadcast.param.{name if name is not None else i}", process_set=process_set))
    for h in handles:
        h.wait()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              model: torch.nn.Module | None = None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Give every rank root's optimizer state (moments, step counts, hyper-parameters).

    As Horovod, an optimizer without state yet gets it first: every trainable parameter gets
    a zero gradient (sparse for ``SparseAdam``, or for ``model``'s sparse embeddings under
    SGD) and the wrapped optimizer steps once, without communicating. Each rank keeps its
    own dlcomm state (compression residuals, the schedule's and the sync mode's state: they
    differ per rank).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
    if not optimizer.state_dict()["state"]:
        _initialise_state(optimizer, model)
    mine = dict(optimizer.state_dict())
    own = {k: mine.pop(k) for k in RANK_LOCAL_KEYS if k in mine}
    is_root = rank() == check_root_rank(root_rank, process_set)  # a world rank, as Horovod's
    state = core_functions.broadcast_object(mine if is_root else None, root_rank,
                                            name="broadcast.optimizer_state",
                                            process_set=process_set)
    if not is_root:
        groups_root = [len(g["params"]) for g in state["param_groups"]]
        groups_mine = [len(g["params"]) for g in mine["param_groups"]]
        if groups_root != groups_mine:
            raise ValueError(f"optimizer parameter groups differ from rank {root_rank}'s: "
                             f"{groups_mine} parameters per group here, {groups_root} there")
        state = {k: v for k, v in state.items() if k not in RANK_LOCAL_KEYS}
        state.update(own)
        optimizer.load_state_dict(state)


def _initialise_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
    """One step of the wrapped optimizer on zero gradients, which creates its state."""
    sparse = set()
    if model is not None:
        sparse = {id(p) for m in model.modules()
                  if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    # A DistributedOptimizer's own step would all-reduce; its wrapped class's step does not.
    getattr(type(optimizer), "_optimizer_class", type(optimizer)).step(optimizer)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return root's (picklable) object on every rank."""
    return core_functions.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return every rank's object, in rank order."""
    return core_functions.allgather_object(obj, name, process_set)
