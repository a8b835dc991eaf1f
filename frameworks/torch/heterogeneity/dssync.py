"""DS-Sync for torch: each rank steps on its own gradient, then parameters are averaged
within this step's group (``dlcomm.heterogeneity.dssync``); ``synchronize_globally()`` averages them
over all ranks (call it before evaluation, checkpoints and at the end of training)."""
from __future__ import annotations

from typing import Any

import torch

from dlcomm.heterogeneity.dssync import GroupCycle, average_in_group, global_average
from dlcomm.torch.heterogeneity.mixin import build_mixin
from dlcomm.torch.mpi_ops import _writeback, to_numpy


class DSSyncOptimizer:
    """Mixin placed in front of the user's optimizer class (see ``build_mixin``)."""

    _optimizer_class: type

    def _setup_dssync(self, group_size: int, seed: int, cycle: int) -> None:
        self._cycle = GroupCycle(group_size, seed, cycle)
        self._params = [p for g in self.param_groups for p in g["params"]]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in self._params:
            if p.device.type != "cpu":
                raise ValueError("sync='dssync' averages CPU parameters; move the model to CPU")
            by_dtype.setdefault(p.dtype, []).append(p)
        self._by_dtype = list(by_dtype.values())
        self.sync_step = 0

    def _arrays(self, params: list[torch.Tensor]) -> list[Any]:
        return [to_numpy(p.data) for p in params]

    def step(self, closure: Any = None) -> Any:
        """Step on the local gradient, then average parameters within this step's group."""
        result = self._optimizer_class.step(self, closure)
        with torch.no_grad():
            for params in self._by_dtype:
                arrays = average_in_group(self._arrays(params), self._cycle, self.sync_step)
                for p, a in zip(params, arrays):
                    _writeback(p.data, a)
        self.sync_step += 1
        return result

    def synchronize(self) -> None:
        """Nothing to wait for: DS-Sync exchanges parameters after ``step()``."""

    def synchronize_globally(self) -> None:
        """Average the parameters over every rank (collective): before evaluation,
        checkpointing and at the end, so that all ranks hold the same model."""
        with torch.no_grad():
            for k, params in enumerate(self._by_dtype):
                arrays = global_average(self._arrays(params), name=f"dssync.global.{k}")
                for p, a in zip(params, arrays):
                    _writeback(p.data, a)

    def group_ranks(self) -> list[int]:
        """The ranks this rank averages with at the coming step."""
        return self._cycle.group_ranks(self.sync_step)


def make_dssync_optimizer(optimizer: torch.optim.Optimizer, group_size: int, seed: int = 0,
                          cycle: int = 8) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` for DS-Sync (collective: splits the cycle's group communicators)."""
    obj = build_mixin(DSSyncOptimizer, optimizer)
    obj._setup_dssync(group_size, seed, cycle)
    return obj
