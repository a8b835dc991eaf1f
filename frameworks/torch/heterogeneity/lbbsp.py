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
from dlcomm.mpi_ops import Handle
from dlcomm.ops import Sum
from dlcomm.process_sets import global_process_set
from dlcomm.torch.compression_state import SYNC_STATE_KEY, pop_sync_state
from dlcomm.torch.schedules.base import build
from dlcomm.torch.schedules.baseline import NoOverlapSchedule
from dlcomm.torch.schedules.wfbp import WFBPSchedule


class LoadBalancedSchedule:
    """Mixin placed in front of a schedule (``wfbp`` or ``none``): gradients weighted by
    ``b_i / B`` before their sum, the compute time of each iteration measured, the batches
    re-sized after each step."""

    def _setup(self, *, balancer: BatchBalancer, **schedule_options: Any) -> None:
        self.balancer = balancer
        self.compute_seconds: list[float] = []
        super()._setup(**schedule_options)
        self._lb_mark = time.perf_counter()

    def _submit_allreduce(self, params: list[torch.Tensor], name: str) -> Handle:
        """Scale the gradients by ``b_i / B`` and all-reduce them with op Sum: the sum is the
        full-batch gradient. (The engine requires the same prescale on every rank, so the
        rank-specific weight is applied to the gradient before submission.)"""
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(self.balancer.weight)
        return super()._submit_allreduce(params, name)

    def step(self, closure: Any = None) -> Any:
        """Measure this rank's compute time, synchronise and step, re-size the batches."""
        compute = max(time.perf_counter() - self._lb_mark, 1e-6)
        self.compute_seconds.append(compute)
        result = super().step(closure)
        if len(self.compute_seconds) > 1:  # the first "iteration" also timed the job's set-up
            self.balancer.update(self.balancer.local_batch, compute)
        self._lb_mark = time.perf_counter()
        return result

    def state_dict(self) -> dict:
        """The schedule's state and, under ``dlcomm_sync``, the balancer's (batch sizes, the
        current interval's samples and seconds, the predictor's speed history) and the
        compute times measured so far: a resumed run re-sizes its batches as this one."""
        state = super().state_dict()
        state[SYNC_STATE_KEY] = {"mode": "lbbsp", "balancer": self.balancer.state_dict(),
                                 "compute_seconds": [float(t) for t in self.compute_seconds]}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what ``state_dict`` returned; without LB-BSP state (a checkpoint of another
        mode) the balancer starts afresh, with a warning."""
        state, sync_state = pop_sync_state(state_dict, "lbbsp", "LB-BSP",
                                           "the batch sizes and speed history start afresh")
        if sync_state is not None:
            self.balancer.load_state_dict(sync_state["balancer"])
            self.compute_seconds = [float(t) for t in sync_state["compute_seconds"]]
        super().load_state_dict(state)
        # The time spent loading is not compute time of the coming iteration.
        self._lb_mark = time.perf_counter()


def make_lbbsp_optimizer(optimizer: torch.optim.Optimizer, options: dict[str, Any], *,
                         schedule: str = "wfbp", **schedule_options: Any
                         ) -> torch.optim.Optimizer:
    """The ``wfbp`` (default) or ``none`` schedule's optimizer with LB-BSP's weighting and
    batch re-sizing; ``schedule_options`` are DistributedOptimizer's validated arguments.

    ``optimizer.balancer`` is the ``BatchBalancer``; hand it to ``BalancedBatchSampler``.
    """
    if schedule_options["process_set"] is not global_process_set:
        raise ValueError("sync='lbbsp' balances over all ranks; process_set must be global")
    if schedule_options["gradient_predivide_factor"] != 1.0:
        raise ValueError("sync='lbbsp' weights gradients by b_i/B; gradient_predivide_factor "
                         "must be 1")
    schedules = {"wfbp": WFBPSchedule, "none": NoOverlapSchedule}
    if schedule not in schedules:
        raise ValueError(f"sync='lbbsp' runs with schedule 'wfbp' (default) or 'none'; got "
                         f"{schedule!r}")
    balancer = BatchBalancer(options["global_batch"], size(), rank(),
                             min_batch=options.get("min_batch", 1),
                             max_batch=options.get("max_batch"),
                             predictor=options.get("predictor", "ema"),
                             interval=options.get("interval", 8))
    balancer.check_same_on_all_ranks()
    return build((LoadBalancedSchedule, schedules[schedule]), optimizer, balancer=balancer,
                 **dict(schedule_options, op=Sum))


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
