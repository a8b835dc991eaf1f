"""Wait-free backpropagation (``wfbp``, the default schedule): all-reduce each gradient as
soon as backward produces it.

A hook on every parameter submits its gradient to the engine the moment autograd has
accumulated it (wait-free backpropagation), so communication overlaps the rest of the
backward pass; ``step()`` only waits for what is still in flight, then steps the wrapped
optimizer. Semantics follow ``horovod.torch.DistributedOptimizer``.
"""
from __future__ import annotations

import warnings

import torch

from dlcomm.mpi_ops import Handle
from dlcomm.torch import mpi_ops
from dlcomm.torch.schedules.base import ScheduleBase


class WFBPSchedule(ScheduleBase):
    """A hook per parameter; a gradient (or a fixed group of them, ``groups=``) travels as
    soon as backward has produced it ``backward_passes_per_step`` times."""

    schedule_name = "wfbp"

    def _request_prefix(self) -> str:
        return "allreduce"  # Horovod's request names: allreduce.<parameter name>

    def _start(self) -> None:
        self._group_of: dict[torch.Tensor, int] = {}
        self._groups: list[list[torch.Tensor]] = self._user_groups or []
        for i, group in enumerate(self._groups):
            for p in group:
                if p not in self._parameter_names:
                    raise ValueError("a parameter in groups= is not one of the optimizer's "
                                     "parameters")
                if p in self._group_of:
                    raise ValueError(f"parameter '{self._parameter_names[p]}' appears in two "
                                     "groups")
                self._group_of[p] = i
        self._delay = {p: self._passes for p in self._parameter_names}
        self._ready_in_group: dict[int, set[torch.Tensor]] = {}
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad)
                       for p in self._params if self._included]

    # --- hooks: submit as soon as a gradient is ready ---------------------------------------
    def _on_grad(self, p: torch.Tensor) -> None:
        if p in self._pending and self._delay[p] <= 0:
            raise RuntimeError(
                f"gradient of '{self._parameter_names[p]}' was computed more than "
                f"backward_passes_per_step={self._passes} times before step(); raise "
                "backward_passes_per_step to accumulate more passes locally")
        self._delay[p] -= 1
        if self._delay[p] <= 0:
            self._gradient_ready(p)

    def _gradient_ready(self, p: torch.Tensor) -> None:
        """``p``'s gradient is complete: send it, or its group once the group is complete."""
        group = self._group_of.get(p)
        if group is None:
            self._pending[p] = self._submit_allreduce([p], self._parameter_names[p])
            return
        ready = self._ready_in_group.setdefault(group, set())
        ready.add(p)
        if len(ready) == len(self._groups[group]):
            self._submit_group(group)

    def _group_name(self, group: int) -> str:
        return f"group.{group}." + self._parameter_names[self._groups[group][0]]

    def _submit_group(self, group: int) -> None:
        members = self._groups[group]
        handle = self._submit_allreduce(members, self._group_name(group))
        for q in members:
            self._pending[q] = handle
        self._ready_in_group.pop(group, None)

    def _submit_allreduce(self, params: list[torch.Tensor], name: str) -> Handle:
        if not self._sparse_as_dense and any(p.grad is not None and p.grad.is_sparse
                                             for p in params):
            if len(params) > 1:
                raise ValueError("sparse gradients cannot be grouped; pass sparse_as_dense=True")
            return self._submit_sparse(params[0], name)
        return super()._submit_allreduce(params, name)

    def _submit_sparse(self, p: torch.Tensor, name: str) -> Handle:
        """Sparse gradients: all-gather indices and values, then sum (as Horovod does)."""
        handle = mpi_ops.sparse_allreduce_async(p.grad, f"sparse.{name}", self._op,
                                                self._process_set)

        def write_back(summed: torch.Tensor) -> None:
            p.grad = summed.coalesce()

        return handle.then(write_back)

    # --- the optimizer API -----------------------------------------------------------------
    def _check_gradients_produced(self) -> None:
        # After synchronize() (a step() without skip_synchronize()), the averaged gradients
        # are all-reduced again, as Horovod does.
        if (not self._pending and not self._synchronized
                and all(self._delay[p] == self._passes for p in self._params)):
            raise RuntimeError(
                "step()/synchronize() was called, but no gradient was produced since the last "
                "step: call loss.backward() first (every rank must run the backward pass)")

    def synchronize(self) -> None:
        """Wait for every gradient's all-reduce and write the results into ``.grad``."""
        if not self._included:  # this rank is outside the optimizer's process set
            self._synchronized = True
            return
        self._check_gradients_produced()
        # Parameters whose hooks did not fire (unused in this pass, or accumulation not
        # complete) are still all-reduced, so every rank submits the same names.
        for p in self._params:
            if p not in self._pending:
                group = self._group_of.get(p)
                if group is None:
                    self._pending[p] = self._submit_allreduce([p], self._parameter_names[p])
                else:
                    self._submit_group(group)
        self._wait_pending()
        for p in self._delay:
            self._delay[p] = self._passes
        self._synchronized = True

    def discard_in_flight(self) -> None:
        super().discard_in_flight()
        self._ready_in_group.clear()
        for p in self._delay:
            self._delay[p] = self._passes

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated before the all-reduce (Horovod's
        method; every rank must call it at the same step)."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {passes!r}")
        if self._pending:
            raise RuntimeError("set_backward_passes_per_step() between backward() and step(): "
                               "call it after step()")
        self._passes = passes
        for p in self._delay:
            self._delay[p] = passes

    def _synchronize_for_step(self) -> None:
        if self._synchronized:
            warnings.warn(
                "optimizer.step() called without optimizer.skip_synchronize() context after "
                "optimizer.synchronize(): the gradients are all-reduced a second time. Wrap "
                "step() in 'with optimizer.skip_synchronize():'", stacklevel=3)
        self.synchronize()
