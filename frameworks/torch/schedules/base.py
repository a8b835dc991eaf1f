"""How every optimizer of ``DistributedOptimizer`` is made, and what the schedules share.

``build`` is the one builder: it places mixin classes in front of the wrapped optimizer's
class (``class X(WFBPSchedule, torch.optim.SGD)``), so ``isinstance(opt, torch.optim.SGD)``
still holds, initialises the result on the optimizer's parameter groups, defaults and state,
and hands the options to the mixins' ``_setup``. The schedules (``wfbp``, ``mgwfbp``,
``dear``, ``none``) derive from ``ScheduleBase``; the heterogeneity modes are mixins built the
same way, alone (DS-Sync, DLCP) or in front of a schedule (LB-BSP).
"""
from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from dlcomm.autotune import autotuner_from_env
from dlcomm.mpi_ops import Handle
from dlcomm.ops import Average, ReduceOp
from dlcomm.process_sets import ProcessSet
from dlcomm.torch.compression import CoreCompressor
from dlcomm.torch.compression_state import (
    COMPRESSION_STATE_KEY,
    SCHEDULE_STATE_KEY,
    SYNC_STATE_KEY,
    to_numpy,
    to_torch,
)
from dlcomm.torch.fused_update import wrapped_step
from dlcomm.torch.gradient_allreduce import momentum_after_allreduce, start_gradient_allreduce

_instances = itertools.count()  # optimizers are built in the same order on every rank


def build(mixins: type | tuple[type, ...], optimizer: torch.optim.Optimizer,
          **options: Any) -> torch.optim.Optimizer:
    """An optimizer of class ``mixins`` + ``optimizer``'s class on the same parameter groups,
    defaults and state; ``options`` go to the mixins' ``_setup``."""
    base = optimizer.__class__
    bases = mixins if isinstance(mixins, tuple) else (mixins,)
    cls = type(base.__name__, (*bases, base), {"_optimizer_class": base})
    obj = cls.__new__(cls)
    base.__init__(obj, optimizer.param_groups)
    obj.defaults = dict(optimizer.defaults)
    obj.state.update(optimizer.state)
    obj._setup(**options)
    return obj


def parameter_names(named_parameters: Any, param_groups: list[dict]) -> dict[torch.Tensor, str]:
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


class ScheduleBase:
    """State and optimizer API shared by the schedules; never used on its own.

    A schedule defines ``_start`` (its own state and hooks) and ``synchronize``; ``step``
    synchronizes (unless inside ``skip_synchronize()``), steps the wrapped optimizer and
    feeds the autotuner.
    """

    schedule_name = "base"
    _optimizer_class: type

    def _setup(self, *, named_parameters: Any, compression: Any, backward_passes_per_step: int,
               op: ReduceOp, gradient_predivide_factor: float,
               groups: list[list[torch.Tensor]] | None, sparse_as_dense: bool,
               process_set: ProcessSet) -> None:
        """Called by ``build`` after the optimizer's own ``__init__``."""
        self._parameter_names = parameter_names(named_parameters, self.param_groups)
        self._compression = compression
        self._core_compressor = (compression.core if isinstance(compression, CoreCompressor)
                                 else None)
        self._passes = backward_passes_per_step
        self._op = op
        self._predivide = gradient_predivide_factor
        self._user_groups = groups
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        # A rank outside the process set trains on its own: no hooks, nothing to synchronize.
        self._included = process_set.process_set_id == 0 or process_set.included()
        self._prefix = self._request_prefix()
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._pending: dict[torch.Tensor, Handle] = {}  # gradients in flight
        self._should_synchronize = True
        self._synchronized = False
        self._autotuner = autotuner_from_env()  # DLCOMM_AUTOTUNE=1
        # Called with each batch of local gradients just before it is sent (the loss scaler
        # checks them for inf/NaN there, before a compressor could drop such values).
        self._gradient_inspectors: list[Callable[[list[torch.Tensor]], None]] = []
        self._start()

    def _request_prefix(self) -> str:
        """The first part of this optimizer's request names (unique per optimizer)."""
        return f"{self.schedule_name}{next(_instances)}"

    def _start(self) -> None:
        raise NotImplementedError

    # --- helpers -------------------------------------------------------------------------
    def _base_step(self, closure: Any = None) -> Any:
        """The wrapped optimizer's own ``step`` (no synchronisation, no hooks)."""
        return wrapped_step(self, self._optimizer_class, closure)

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
                raise ValueError(f"parameter '{self._parameter_names[p]}' has a sparse gradient; "
                                 f"the '{self.schedule_name}' schedule sends dense gradients: pass "
                                 "sparse_as_dense=True or use schedule='wfbp'")
            p.grad = p.grad.to_dense()
        return p.grad

    def _submit_allreduce(self, params: list[torch.Tensor], name: str) -> Handle:
        """Start one (grouped) in-place all-reduce of these parameters' gradients."""
        pre, post = self._scales()
        was_sparse = [p for p in params if p.grad is not None and p.grad.is_sparse]
        grads = [self._dense_grad(p) for p in params]
        for inspect in self._gradient_inspectors:
            inspect(grads)
        handle = start_gradient_allreduce(
            grads, f"{self._prefix}.{name}",
            compression=self._compression, core_compressor=self._core_compressor,
            op=self._op, prescale_factor=pre, postscale_factor=post,
            process_set=self._process_set, momentum=momentum_after_allreduce(self))
        if not was_sparse:
            return handle

        def back_to_sparse(_: Any) -> None:
            # sparse_as_dense: the optimizer (SparseAdam, ...) gets a sparse gradient back, as
            # with Horovod.
            for p in was_sparse:
                p.grad = p.grad.to_sparse()

        return handle.then(back_to_sparse)

    def _record_step_for_autotune(self) -> None:
        """Feed this step's time to the autotuner (all ranks at the same step, nothing of
        ours in flight: a safe point to change engine settings)."""
        if self._autotuner is not None:
            self._autotuner.step_finished()

    def _wait_pending(self) -> None:
        """Wait for every gradient in flight (a group's handle once) and forget them."""
        for handle in {id(h): h for h in self._pending.values()}.values():
            handle.wait()
        self._pending.clear()

    def discard_in_flight(self) -> None:
        """Forget the gradients in flight without waiting: the job lost a rank, so their
        all-reduces failed, and elastic training restores the committed state next."""
        self._pending.clear()
        self._synchronized = False

    # --- the optimizer API ---------------------------------------------------------------
    def synchronize(self) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside, ``step()`` does not synchronize (call ``synchronize()`` yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _synchronize_for_step(self) -> None:
        """What ``step()`` does before stepping: synchronize unless the user just did."""
        if not self._synchronized:
            self.synchronize()

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize and self._included:
            self._synchronize_for_step()
        self._synchronized = False
        result = self._base_step(closure)
        self._record_step_for_autotune()
        return result

    def _schedule_state(self) -> dict | None:
        """What the schedule itself needs to continue exactly (plain Python values), or
        None when it keeps nothing across steps (``wfbp``, ``none``, ``dear`` once flushed)."""
        return None

    def _load_schedule_state(self, state: dict | None) -> None:
        """Restore what ``_schedule_state`` returned (None: the checkpoint holds none)."""

    def state_dict(self) -> dict:
        """The wrapped optimizer's state and dlcomm's: under ``dlcomm_compression`` the
        compressor's (residuals, low-rank factors, step counters, by tensor name), under
        ``dlcomm_schedule`` the schedule's (MG-WFBP's profile and merge plan): what a run
        resumed through ``load_state_dict`` needs to continue exactly as the uninterrupted
        run."""
        if self._pending:
            raise RuntimeError("optimizer.state_dict() was called while gradients are being "
                               "all-reduced (after backward, before step()); call it after "
                               "optimizer.step()")
        state = self._optimizer_class.state_dict(self)
        if self._core_compressor is not None:
            state[COMPRESSION_STATE_KEY] = to_torch(self._core_compressor.state_dict())
        schedule_state = self._schedule_state()
        if schedule_state is not None:
            state[SCHEDULE_STATE_KEY] = schedule_state
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what ``state_dict`` returned. A checkpoint without compression state (a plain
        optimizer's) starts the compressor afresh, with a warning: the run then is not the
        uninterrupted one; the same for the schedule's state."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict (from optimizer.state_dict()), got "
                            f"{type(state_dict).__name__}")
        if self._pending:
            raise RuntimeError("optimizer.load_state_dict() was called while gradients are "
                               "being all-reduced (after backward, before step()); call it "
                               "before backward or after optimizer.step()")
        state = dict(state_dict)
        compression_state = state.pop(COMPRESSION_STATE_KEY, None)
        schedule_state = state.pop(SCHEDULE_STATE_KEY, None)
        if state.pop(SYNC_STATE_KEY, None) is not None:  # LB-BSP's mixin took its own
            warnings.warn("the checkpoint holds the state of a sync mode (dssync, lbbsp), but "
                          "this optimizer runs sync='bsp': it is ignored", stacklevel=2)
        if self._core_compressor is not None:
            if compression_state is None:
                warnings.warn("the checkpoint holds no compression state (saved by a plain "
                              "optimizer or without compression): error-feedback residuals "
                              "and low-rank factors start from zero", stacklevel=2)
                self._core_compressor.reset_state()
            else:
                self._core_compressor.load_state_dict(to_numpy(compression_state))
        elif compression_state is not None:
            warnings.warn("the checkpoint holds compression state, but this optimizer does "
                          "not compress: it is ignored", stacklevel=2)
        self._load_schedule_state(schedule_state)
        self._optimizer_class.load_state_dict(self, state)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._pending:
            raise RuntimeError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(); this would drop gradients "
                "that are being all-reduced")
        return self._optimizer_class.zero_grad(self, set_to_none)
