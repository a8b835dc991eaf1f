"""LB-BSP for torch: gradients summed with weight ``b_i / B`` (so the sum is the full-batch
gradient), local batch sizes re-sized after every step from measured compute speeds, and a
batch sampler that hands out each rank's slice of one shuffled stream.

The optimizer keeps the wait-free backpropagation of the default path (each gradient is
all-reduced as backward produces it), scaled by ``b_i / B`` and summed (``op=Sum``); with
``schedule="none"`` the scaled gradients are all-reduced in one grouped request in ``step()``
instead (no communication while the ranks compute). The compute
time of an iteration is measured from the end of the previous ``step()`` to the start of this
one (data loading, forward, backward), so time spent waiting for other ranks does not count.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dlcomm.basics import rank, size
from dlcomm.heterogeneity.lbbsp import BatchBalancer
from dlcomm.ops import Sum
from dlcomm.process_sets import global_process_set
from dlcomm.torch.schedules.base import build
from dlcomm.torch.schedules.baseline import NoOverlapSchedule
from dlcomm.torch.schedules.wfbp import _DistributedOptimizer, _parameter_names


def make_lbbsp_optimizer(optimizer: torch.optim.Optimizer, named_parameters: Any,
                         options: dict[str, Any], *, compression: Any,
                         backward_passes_per_step: int, op: Any,
                         gradient_predivide_factor: float, groups: Any, sparse_as_dense: bool,
                         process_set: Any, schedule: str = "wfbp") -> torch.optim.Optimizer:
    """The default (``wfbp``) or the ``none`` schedule's optimizer with LB-BSP's weighting
    and batch re-sizing.

    ``optimizer.balancer`` is the ``BatchBalancer``; hand it to ``BalancedBatchSampler``.
    """
    if process_set is not global_process_set:
        raise ValueError("sync='lbbsp' balances over all ranks; process_set must be global")
    if gradient_predivide_factor != 1.0:
        raise ValueError("sync='lbbsp' weights gradients by b_i/B; gradient_predivide_factor "
                         "must be 1")
    if schedule not in ("wfbp", "none"):
        raise ValueError(f"sync='lbbsp' runs with schedule 'wfbp' (default) or 'none'; got "
                         f"{schedule!r}")
    balancer = BatchBalancer(options["global_batch"], size(), rank(),
                             min_batch=options.get("min_batch", 1),
                             max_batch=options.get("max_batch"),
                             predictor=options.get("predictor", "ema"),
                             interval=options.get("interval", 8))
    balancer.check_same_on_all_ranks()
    if schedule == "none":
        wrapped = build(_weighted_no_overlap(), optimizer,
                        names=_parameter_names(named_parameters, optimizer.param_groups),
                        compression=compression,
                        backward_passes_per_step=backward_passes_per_step, op=Sum,
                        gradient_predivide_factor=1.0, groups=groups,
                        sparse_as_dense=sparse_as_dense, process_set=global_process_set)
    else:
        namespace = dict(_DistributedOptimizer.__dict__)
        namespace.update(_submit=_weighted_submit, step=_balanced_wfbp_step)
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,), namespace)
        wrapped = cls(optimizer.param_groups, named_parameters, compression,
                      backward_passes_per_step, Sum, 1.0, groups, sparse_as_dense,
                      global_process_set)
    wrapped.balancer = balancer
    wrapped._lb_mark = time.perf_counter()
    wrapped.compute_seconds = []
    return wrapped


def _scale_gradients(params: list[torch.Tensor], weight: float) -> None:
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.grad.mul_(weight)


def _weighted_submit(self: Any, params: list[torch.Tensor], name: str) -> Any:
    """Scale the gradients by ``b_i / B`` and all-reduce them with op Sum: the sum is the
    full-batch gradient. (The engine requires the same prescale on every rank, so the
    rank-specific weight is applied to the gradient before submission.)"""
    _scale_gradients(params, self.balancer.weight)
    return _DistributedOptimizer._submit(self, params, name)


def _balanced_step(self: Any, closure: Any, base_step: Any) -> Any:
    """Measure this rank's compute time, synchronise and step (``base_step``), then re-size
    the batches."""
    compute = max(time.perf_counter() - self._lb_mark, 1e-6)
    self.compute_seconds.append(compute)
    result = base_step(self, closure)
    if len(self.compute_seconds) > 1:  # the first "iteration" also timed the job's set-up
        self.balancer.update(self.balancer.local_batch, compute)
    self._lb_mark = time.perf_counter()
    return result


def _balanced_wfbp_step(self: Any, closure: Any = None) -> Any:
    """Measure this rank's compute time, wait for the gradients, step, re-size the batches."""
    return _balanced_step(self, closure, _DistributedOptimizer.step)


def _weighted_no_overlap() -> type:
    class WeightedNoOverlap(NoOverlapSchedule):
        """The ``none`` schedule with gradients scaled by ``b_i / B`` before the sum."""

        def _submit_allreduce(self, params: list[torch.Tensor], name: str) -> Any:
            _scale_gradients(params, self.balancer.weight)
            return NoOverlapSchedule._submit_allreduce(self, params, name)

        def step(self, closure: Any = None) -> Any:
            return _balanced_step(self, closure, NoOverlapSchedule.step)

    return WeightedNoOverlap


class BalancedBatchSampler:
    """Yields this rank's index batches: consecutive slices of one shuffled stream.

    Each epoch draws one permutation of ``range(num_samples)`` from ``seed + epoch`` (the
    same on every rank). Step ``t`` covers stream positions ``[t*B, (t+1)*B)``; rank ``i``
    takes ``b_i`` of them starting at ``offset_i``, reading the balancer's current sizes when
    the batch is drawn, so all ranks take the same number of steps and end each epoch
    together (the last ``num_samples mod B`` samples are dropped). Use it as
    ``DataLoader(dataset, batch_sampler=sampler)`` with ``num_workers=0`` (workers would read
    the sizes too early).
    """

    def __init__(self, num_samples: int, balancer: BatchBalancer, seed: int = 0,
                 shuffle: bool = True) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        if not isinstance(balancer, BatchBalancer):
            raise TypeError(f"balancer must be a BatchBalancer (optimizer.balancer), got "
                            f"{type(balancer).__name__}")
        if num_samples < balancer.global_batch:
            raise ValueError(f"num_samples ({num_samples}) is smaller than the global batch "
                             f"({balancer.global_batch})")
        self.num_samples = num_samples
        self.balancer = balancer
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the permutation of the coming epoch (call on every rank)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_samples // self.balancer.global_batch

    def __iter__(self) -> Iterator[list[int]]:
        order = (np.random.default_rng(self.seed + self.epoch).permutation(self.num_samples)
                 if self.shuffle else np.arange(self.num_samples))
        b = self.balancer
        for step in range(len(self)):
            start = step * b.global_batch + b.offsets()[b.rank]
            yield order[start:start + b.local_batch].tolist()
