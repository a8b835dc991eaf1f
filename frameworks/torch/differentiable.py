"""The synchronous torch collectives as autograd functions, so gradients flow through them
as through Horovod's (``horovod.torch.mpi_ops``).

The backward passes follow Horovod's conventions, which are not all the derivative of one
loss (docs/compatibility.md):

* all-reduce (and grouped): the same all-reduce of the gradient (op, prescale, postscale);
  for Sum and Average that is the derivative of the sum of every rank's loss;
* all-gather (and grouped): this rank's rows of the gradient averaged over ranks;
* broadcast: on the root, the gradient averaged over ranks; zeros elsewhere;
* alltoall: the gradient sent back the way the rows came (alltoall with the received splits);
* reduce-scatter (and grouped): the gradient all-gathered, times the number of ranks for Sum,
  times the prescale and postscale factors.

Requests made in backward are named automatically: every rank runs backward in the same order.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dlcomm import mpi_ops as core
from dlcomm.basics import rank
from dlcomm.ops import Average, ReduceOp, Sum
from dlcomm.process_sets import ProcessSet
from dlcomm.torch.tensor_bridge import as_tensor, to_numpy


def _allreduce(tensors: list[torch.Tensor], op: ReduceOp, pre: float, post: float,
               process_set: ProcessSet, name: str | None = None, compression: Any = None,
               grouped: bool = False) -> list[torch.Tensor]:
    """All-reduce into new tensors: a grouped request, or one of kind allreduce (so that its
    automatic name is the one an ``allreduce_async`` would get)."""
    arrays = [to_numpy(t) for t in tensors]
    if grouped:
        results = core.grouped_allreduce(arrays, name, op, pre, post, process_set)
    else:
        results = [core.allreduce(arrays[0], name, op, pre, post, process_set,
                                  compression=compression)]
    return [as_tensor(r, t) for r, t in zip(results, tensors)]


def _rows_before_me(rows: list[int], process_set: ProcessSet) -> list[int]:
    """Where this rank's rows start in each gathered tensor (rows: this rank's row counts)."""
    mine = np.asarray(rows, dtype=np.int64)[None, :]
    everyone = core.allgather(mine, None, process_set)  # (ranks, tensors)
    return [int(v) for v in everyone[:process_set.rank()].sum(axis=0)]


class AllreduceFunction(torch.autograd.Function):
    """``allreduce``: backward is the same all-reduce of the gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp, pre: float,
                post: float, process_set: ProcessSet, compression: Any) -> torch.Tensor:
        ctx.args = (op, pre, post, process_set)
        return _allreduce([tensor], op, pre, post, process_set, name, compression)[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (_allreduce([grad], *ctx.args)[0], None, None, None, None, None, None)


class GroupedAllreduceFunction(torch.autograd.Function):
    """``grouped_allreduce``: backward is the same grouped all-reduce of the gradients."""

    @staticmethod
    def forward(ctx: Any, name: str | None, op: ReduceOp, pre: float, post: float,
                process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, pre, post, process_set)
        return tuple(_allreduce(list(tensors), op, pre, post, process_set, name, grouped=True))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        return (None, None, None, None, None, *_allreduce(list(grads), *ctx.args, grouped=True))


def _gather_backward(grads: list[torch.Tensor], rows: list[int],
                     process_set: ProcessSet) -> list[torch.Tensor]:
    averaged = _allreduce(grads, Average, 1.0, 1.0, process_set, grouped=True)
    starts = _rows_before_me(rows, process_set)
    return [g.narrow(0, start, n) for g, start, n in zip(averaged, starts, rows)]


class AllgatherFunction(torch.autograd.Function):
    """``allgather``: backward is this rank's rows of the gradient averaged over ranks."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return as_tensor(core.allgather(to_numpy(tensor), name, process_set), tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (_gather_backward([grad], [ctx.rows], ctx.process_set)[0], None, None)


class GroupedAllgatherFunction(torch.autograd.Function):
    """``grouped_allgather``: backward as ``allgather``'s, per tensor, in grouped requests."""

    @staticmethod
    def forward(ctx: Any, name: str | None, process_set: ProcessSet,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        results = core.grouped_allgather([to_numpy(t) for t in tensors], name, process_set)
        return tuple(as_tensor(r, t) for r, t in zip(results, tensors))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        return (None, None, *_gather_backward(list(grads), ctx.rows, ctx.process_set))


class BroadcastFunction(torch.autograd.Function):
    """``broadcast``: backward is the gradient averaged over ranks on the root, zeros
    elsewhere."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return as_tensor(core.broadcast(to_numpy(tensor), root_rank, name, process_set), tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        averaged = _allreduce([grad], Average, 1.0, 1.0, ctx.process_set)[0]
        if rank() != ctx.root_rank:
            averaged = torch.zeros_like(averaged)
        return (averaged, None, None, None)


class AlltoallFunction(torch.autograd.Function):
    """``alltoall``: backward sends the gradient back the way the rows came."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: ProcessSet) -> tuple[torch.Tensor, torch.Tensor]:
        out, received = core.alltoall(to_numpy(tensor), splits, name, process_set)
        received = torch.from_numpy(np.asarray(received, dtype=np.int32))
        ctx.received, ctx.process_set = received.tolist(), process_set
        ctx.mark_non_differentiable(received)
        return as_tensor(out, tensor), received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[Any, ...]:
        back, _ = core.alltoall(to_numpy(grad), ctx.received, None, ctx.process_set)
        return (as_tensor(back, grad), None, None, None)


def _scatter_backward(grads: list[torch.Tensor], op: ReduceOp, pre: float, post: float,
                      process_set: ProcessSet) -> list[torch.Tensor]:
    factor = (process_set.size() if op is Sum else 1) * pre * post
    scaled = [g * factor if factor != 1 else g for g in grads]
    gathered = core.grouped_allgather([to_numpy(g) for g in scaled], None, process_set)
    return [as_tensor(r, g) for r, g in zip(gathered, grads)]


class ReducescatterFunction(torch.autograd.Function):
    """``reducescatter``: backward all-gathers the (scaled) gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp,
                process_set: ProcessSet, pre: float, post: float) -> torch.Tensor:
        ctx.args = (op, pre, post, process_set)
        result = core.reducescatter(to_numpy(tensor), name, op, process_set, pre, post)
        return as_tensor(result, tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (_scatter_backward([grad], *ctx.args)[0], None, None, None, None, None)


class GroupedReducescatterFunction(torch.autograd.Function):
    """``grouped_reducescatter``: backward as ``reducescatter``'s, per tensor."""

    @staticmethod
    def forward(ctx: Any, name: str | None, op: ReduceOp, process_set: ProcessSet, pre: float,
                post: float, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, pre, post, process_set)
        results = core.grouped_reducescatter([to_numpy(t) for t in tensors], name, op,
                                             process_set, pre, post)
        return tuple(as_tensor(r, t) for r, t in zip(results, tensors))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        return (None, None, None, None, None, *_scatter_backward(list(grads), *ctx.args))
