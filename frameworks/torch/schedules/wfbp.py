"""Wait-free backpropagation (``wfbp``, the default schedule): all-reduce each gradient as
soon as backward produces it.

A hook on every parameter submits its gradient to the engine the moment autograd has
accumulated it (wait-free backpropagation), so communication overlaps the rest of the
backward pass; ``step()`` only waits for what is still in flight, then steps the wrapped
optimizer. Semantics follow ``horovod.torch.DistributedOptimizer``.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from dlcomm.ops import Average, ReduceOp
from dlcomm.process_sets import ProcessSet
from dlcomm.torch import mpi_ops
from dlcomm.torch.compression import CoreCompressor
from dlcomm.torch.gradient_allreduce import momentum_after_allreduce, start_gradient_allreduce


class _Pending:
    """One submitted gradient (or group): the handle and how to put results back."""

    __slots__ = ("finish", "handle")

    def __init__(self, handle: Any, finish: Any) -> None:
        self.handle = handle
        self.finish = finish


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params: Any, named_parameters: Any, compression: Any,
                 backward_passes_per_step: int, op: ReduceOp, gradient_predivide_factor: float,
                 groups: list[list[torch.Tensor]] | None, sparse_as_dense: bool,
                 process_set: ProcessSet) -> None:
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._core_compressor = (compression.core if isinstance(compression, CoreCompressor)
                                 else None)
        self._passes = backward_passes_per_step
        self._op = op
        self._predivide = gradient_predivide_factor
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        all_params = [p for g in self.param_groups for p in g["params"]]
        self._names = _parameter_names(named_parameters, self.param_groups)
        self._group_of: dict[torch.Tensor, int] = {}
        self._groups = groups or []
        for i, group in enumerate(self._groups):
            for p in group:
                if p not in self._names:
                    raise ValueError("a parameter in groups= is not one of the optimizer's "
                                     "parameters")
                if p in self._group_of:
                    raise ValueError(f"parameter '{self._names[p]}' appears in two groups")
                self._group_of[p] = i
        self._delay = {p: self._passes for p in all_params}
        self._ready_in_group: dict[int, set[torch.Tensor]] = {}
        self._pending: dict[torch.Tensor, _Pending] = {}
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                              for p in all_params if p.requires_grad]

    # --- hooks: submit as soon as a gradient is ready -------------------------------------
    def _on_grad(self, p: torch.Tensor) -> None:
        if p in self._pending and self._delay[p] <= 0:
            raise RuntimeError(
                f"gradient of '{self._names[p]}' was computed more than "
                f"backward_passes_per_step={self._passes} times before step(); raise "
                "backward_passes_per_step to accumulate more passes locally")
        self._delay[p] -= 1
        if self._delay[p] > 0:
            return
        group = self._group_of.get(p)
        if group is None:
            self._pending[p] = self._submit([p], self._names[p])
            return
        ready = self._ready_in_group.setdefault(group, set())
        ready.add(p)
        if len(ready) == len(self._groups[group]):
            members = self._groups[group]
            pending = self._submit(members, f"group.{group}." + self._names[members[0]])
            for q in members:
                self._pending[q] = pending
            del self._ready_in_group[group]

    def _scales(self) -> tuple[float, float]:
        if self._op is Average:  # Average's 1/size is applied by the engine after the sum
            return 1.0 / self._predivide, self._predivide
        return 1.0, 1.0

    def _submit(self, params: list[torch.Tensor], name: str) -> _Pending:
        """Start the all-reduce of these parameters' gradients (one fused request)."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                if not self._sparse_as_dense:
                    if len(params) > 1:
                        raise ValueError("sparse gradients cannot be grouped; pass "
                                         "sparse_as_dense=True")
                    return self._submit_sparse(p, name)
                p.grad = p.grad.to_dense()
        pre, post = self._scales()
        return _Pending(None, start_gradient_allreduce(
            [p.grad for p in params], f"allreduce.{name}", compression=self._compression,
            core_compressor=self._core_compressor, op=self._op, prescale_factor=pre,
            postscale_factor=post, process_set=self._process_set,
            momentum=momentum_after_allreduce(self)))

    def _submit_sparse(self, p: torch.Tensor, name: str) -> _Pending:
        """Sparse gradients: all-gather indices and values, then sum (as Horovod does)."""
        grad = p.grad.coalesce()
        values = mpi_ops.allgather_async(grad.values(), name=f"sparse.{name}.values",
                                         process_set=self._process_set)
        indices = mpi_ops.allgather_async(grad.indices().t().contiguous(),
                                          name=f"sparse.{name}.indices",
                                          process_set=self._process_set)

        def finish() -> None:
            all_values = values.wait()
            all_indices = indices.wait().t()
            summed = torch.sparse_coo_tensor(all_indices, all_values, grad.shape).coalesce()
            if self._op is Average:
                summed = summed / self._process_set.size()
            p.grad = summed

        return _Pending(None, finish)

    # --- the optimizer API -----------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for every gradient's all-reduce and write the results into ``.grad``."""
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if not self._pending and all(self._delay[p] == self._passes for p in params):
            raise RuntimeError(
                "step()/synchronize() was called, but no gradient was produced since the last "
                "step: call loss.backward() first (every rank must run the backward pass)")
        # Parameters whose hooks did not fire (unused in this pass, or accumulation not
        # complete) are still all-reduced, so every rank submits the same names.
        for p in params:
            if p not in self._pending:
                group = self._group_of.get(p)
                if group is None:
                    self._pending[p] = self._submit([p], self._names[p])
                elif group in self._ready_in_group or not any(
                        q in self._pending for q in self._groups[group]):
                    members = self._groups[group]
                    pending = self._submit(members, f"group.{group}." + self._names[members[0]])
                    for q in members:
                        self._pending[q] = pending
                    self._ready_in_group.pop(group, None)
        finished: set[int] = set()
        for pending in self._pending.values():
            if id(pending) not in finished:
                finished.add(id(pending))
                pending.finish()
        self._pending.clear()
        for p in self._delay:
            self._delay[p] = self._passes
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside, ``step()`` does not synchronize (call ``synchronize()`` yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called after optimizer.synchronize() without "
                    "skip_synchronize(): the gradients are averaged twice. Wrap step() in "
                    "'with optimizer.skip_synchronize():'", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._pending:
            raise RuntimeError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(); this would drop gradients "
                "that are being all-reduced")
        return super(self.__class__, self).zero_grad(set_to_none)


def _parameter_names(named_parameters: Any, param_groups: list[dict]) -> dict[torch.Tensor, str]:
    """Map each optimizer parameter to a name; validate the user's names."""
    all_params = [p for g in param_groups for p in g["params"]]
    if named_parameters is None:
        return {p: f"noname.{gi}.{pi}" for gi, g in enumerate(param_groups)
                for pi, p in enumerate(g["params"])}
    named = list(named_parameters)
    if any(not isinstance(t, tuple) or len(t) != 2 or not isinstance(t[0], str) for t in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique; duplicated: "
                         f"{duplicates}")
    by_param = {p: n for n, p in named}
    unnamed = [p for p in all_params if p not in by_param]
    if unnamed:
        shapes = [tuple(p.shape) for p in unnamed]
        raise ValueError(f"named_parameters was given, but {len(unnamed)} of the optimizer's "
                         f"parameters are missing from it (shapes {shapes}); pass "
                         "model.named_parameters() of the model the optimizer trains")
    return {p: by_param[p] for p in all_params}
