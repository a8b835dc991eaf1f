"""``DistributedOptimizer``: wrap a torch optimizer so gradients are averaged over ranks.

It validates the arguments once and builds, through the one builder
(``schedules.base.build``), the optimizer of the chosen schedule (``schedules``: ``wfbp`` by
default, ``mgwfbp``, ``dear``, ``none``) or heterogeneity mode (``heterogeneity``: DS-Sync,
LB-BSP, DLCP). Semantics follow ``horovod.torch.DistributedOptimizer``.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from dlcomm.ops import Average, ReduceOp, as_reduce_op
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.torch.compression import NoneCompressor, resolve
from dlcomm.torch.fused_update import configure_update, resolve_fused_update
from dlcomm.torch.heterogeneity import make_sync_optimizer, resolve_loss_tolerance, resolve_sync
from dlcomm.torch.schedules import make_scheduled_optimizer, resolve_schedule


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: Any = None, backward_passes_per_step: int = 1,
                         op: ReduceOp = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set,
                         schedule: str | None = None, sync: str | None = None,
                         loss_tolerance: float | None = None,
                         fused_update: str | None = None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that gradients are averaged over ranks before each step.

    ``compression``: ``Compression.none``/``fp16``, a dlcomm compressor
    (``Compression.lookup("topk:ratio=0.01")`` or its spec string), or None to follow
    ``DLCOMM_COMPRESSION`` (default none). ``num_groups`` splits the parameters into that many
    fused groups; ``groups`` lists them explicitly (lists of parameters). ``schedule``:
    ``wfbp``, ``mgwfbp``, ``dear`` or ``none`` (see docs/schedules.md), None to follow
    ``DLCOMM_SCHEDULE`` (default wfbp). ``sync``: ``bsp`` (default), ``dssync:group_size=S``
    or ``lbbsp:global_batch=B``, None to follow ``DLCOMM_SYNC``; ``loss_tolerance`` > 0
    (0 follows ``DLCOMM_LOSS_TOLERANCE``): DLCP bounded-loss exchange (docs/heterogeneity.md).
    ``fused_update``: ``off``, ``foreach`` or ``fused`` (torch's multi-tensor update paths),
    None to follow ``DLCOMM_FUSED_UPDATE`` (default off); the result's
    ``update_implementation`` says what its groups use (docs/compression.md).
    """
    schedule = resolve_schedule(schedule)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if (isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int)
            or backward_passes_per_step < 1):
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got "
                         f"{backward_passes_per_step!r}")
    op = as_reduce_op(op)
    if op not in (Average, ReduceOp.SUM):
        raise ValueError(f"DistributedOptimizer averages or sums gradients; op={op!r} is "
                         "not meaningful")
    if gradient_predivide_factor != 1.0 and op is not Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
    compression = resolve(compression)
    all_params = [p for g in optimizer.param_groups for p in g["params"]]
    group_list = _make_groups(num_groups, groups, all_params)
    if compression is not NoneCompressor and sparse_as_dense is False and any(
            p.is_sparse for p in all_params):
        raise ValueError("compression is not supported for sparse parameters")
    fused_update = resolve_fused_update(fused_update)
    sync_mode, sync_options = resolve_sync(sync)
    tolerance = resolve_loss_tolerance(loss_tolerance)  # None: DLCOMM_LOSS_TOLERANCE
    options = dict(named_parameters=named_parameters, compression=compression,
                   backward_passes_per_step=backward_passes_per_step, op=op,
                   gradient_predivide_factor=gradient_predivide_factor, groups=group_list,
                   sparse_as_dense=sparse_as_dense, process_set=process_set)
    if sync_mode != "bsp" or tolerance > 0:
        if schedule != "wfbp" and not (sync_mode == "lbbsp" and schedule == "none"):
            raise ValueError(f"sync={sync_mode!r}/loss_tolerance replace the all-reduce "
                             f"schedule; drop schedule={schedule!r} (LB-BSP also takes "
                             f"schedule='none')")
        wrapped = make_sync_optimizer(sync_mode, sync_options, tolerance, optimizer, schedule,
                                      **options)
    else:
        wrapped = make_scheduled_optimizer(schedule, optimizer, **options)
    wrapped.update_implementation = configure_update(wrapped, type(optimizer), fused_update)
    return wrapped


def _make_groups(num_groups: int, groups: Any, params: list[torch.Tensor]
                 ) -> list[list[torch.Tensor]] | None:
    if groups is not None and num_groups:
        raise ValueError("give num_groups or groups, not both")
    if groups is not None:
        if isinstance(groups, int):  # Horovod's older meaning: a number of groups
            num_groups = groups
        else:
            group_list = [list(g) for g in groups]
            if not all(isinstance(p, torch.Tensor) for g in group_list for p in g):
                raise ValueError("groups must be a list of lists of parameters")
            return group_list
    if not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be an int >= 0, got {num_groups!r}")
    if num_groups == 0:
        return None
    trainable = [p for p in params if p.requires_grad]
    n = min(num_groups, len(trainable))
    size, extra = divmod(len(trainable), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(trainable[start:end])
        start = end
    return out
