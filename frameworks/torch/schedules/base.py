"""What every non-default schedule shares: parameter names, gradient scaling, gradient-ready
counting over ``backward_passes_per_step``, the grouped all-reduce submission, and the
construction of the optimizer subclass that a schedule mixes into the user's optimizer.

A schedule is a mixin class placed in front of the wrapped optimizer's class (``class
X(Schedule, torch.optim.SGD)``), so ``isinstance(opt, torch.optim.SGD)`` still holds and
the optimizer's own ``step`` is reachable as ``self._base_step()``.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch

from dlcomm.autotune import autotuner_from_env
from dlcomm.ops import Average, ReduceOp
from dlcomm.process_sets import ProcessSet
from dlcomm.torch.compression import CoreCompressor
from dlcomm.torch.gradient_allreduce import momentum_after_allreduce, start_gradient_allreduce

_instances = itertools.count()  # optimizers are built in the same order on every rank


class GroupHandle:
    """One submitted group of gradients: call ``finish()`` to wait and write them back."""

    __slots__ = ("finish", "submitted_at")

    def __init__(self, finish: Callable[[], None]) -> None:
        self.finish = finish
        self.submitted_at = time.perf_counter()


class ScheduleBase:
    """State and helpers shared by the schedules; never used on its own."""

    schedule_name = "base"

    def _setup(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str],
               compression: Any, backward_passes_per_step: int, op: ReduceOp,
               gradient_predivide_factor: float, groups: list[list[torch.Tensor]] | None,
               sparse_as_dense: bool, process_set: ProcessSet) -> None:
        """Called by ``build`` after the optimizer's own ``__init__``."""
        self.defaults = dict(optimizer.defaults)
        self.state.update(optimizer.state)
        self._names = names
        self._compression = compression
        self._core_compressor = (compression.core if isinstance(compression, CoreCompressor)
                                 else None)
        self._passes = backward_passes_per_step
        self._op = op
        self._predivide = gradient_predivide_factor
        self._user_groups = groups
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self._prefix = f"{self.schedule_name}{next(_instances)}"
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._index = {p: i for i, p in enumerate(self._params)}
        self._autotuner = _autotuner_from_env()

    # --- helpers -------------------------------------------------------------------------
    def _base_step(self, closure: Any = None) -> Any:
        """The wrapped optimizer's own ``step`` (no synchronisation, no hooks)."""
        return self._optimizer_class.step(self, closure)

    def _scales(self) -> tuple[float, float]:
        if self._op is Average:  # the engine applies Average's 1/size after the sum
            return 1.0 / self._predivide, self._predivide
        return 1.0, 1.0

    def _dense_grad(self, p: torch.Tensor) -> torch.Tensor:
        """``p.grad`` as a dense tensor (zeros when backward did not reach ``p``)."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:
            if not self._sparse_as_dense:
                raise ValueError(f"parameter '{self._names[p]}' has a sparse gradient; the "
                                 f"'{self.schedule_name}' schedule sends dense gradients: pass "
                                 "sparse_as_dense=True or use schedule='wfbp'")
            p.grad = p.grad.to_dense()
        return p.grad

    def _submit_allreduce(self, params: list[torch.Tensor], name: str) -> GroupHandle:
        """Start one grouped in-place all-reduce of these parameters' gradients."""
        pre, post = self._scales()
        return GroupHandle(start_gradient_allreduce(
            [self._dense_grad(p) for p in params], f"{self._prefix}.{name}",
            compression=self._compression, core_compressor=self._core_compressor,
            op=self._op, prescale_factor=pre, postscale_factor=post,
            process_set=self._process_set, momentum=momentum_after_allreduce(self)))

    def _record_step_for_autotune(self) -> None:
        """Feed this step's time to the autotuner (all ranks at the same step)."""
        if self._autotuner is not None:
            self._autotuner.step_finished()


def _autotuner_from_env() -> Any:
    """The process's autotuner when ``DLCOMM_AUTOTUNE`` is on, else None."""
    return autotuner_from_env()


def build(mixin: type, optimizer: torch.optim.Optimizer, **kwargs: Any) -> torch.optim.Optimizer:
    """Make ``mixin`` + ``optimizer``'s class, initialised on ``optimizer``'s parameter groups."""
    base = optimizer.__class__
    cls = type(base.__name__, (mixin, base), {"_optimizer_class": base})
    obj = cls.__new__(cls)
    base.__init__(obj, optimizer.param_groups)
    obj._setup(optimizer, **kwargs)
    obj._start()
    return obj
