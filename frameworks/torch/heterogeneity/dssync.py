"""DS-Sync for torch: each rank steps on its own gradient, then parameters are averaged
within this step's group (``dlcomm.heterogeneity.dssync``).

Between global averages the ranks hold different models, so the optimizer averages over all
ranks wherever the model is read as *the* model, and a script that only set
``DLCOMM_SYNC=dssync:...`` still ends with one model:

* a module holding the optimizer's parameters switching to evaluation mode (seen at its
  first forward in eval mode after a training forward: a global forward pre-hook, as DeAR
  uses);
* ``state_dict()`` of the optimizer, or of a module holding its parameters (once that module
  has run a forward);
* ``synchronize_globally()``;
* the end of the script (an ``atexit`` handler), unless this rank is exiting with an
  uncaught exception: it then tells the other ranks, which raise instead of waiting.

Each point is a collective that every rank must reach at the same step; it is skipped when
no step ran since the last one (so ``model.eval()`` after ``synchronize_globally()`` costs
nothing, and the parameters as broadcast before the first step count as synchronised). A
rank that reaches one alone (evaluating on rank 0 only) gets ``MismatchError`` on every rank
instead of a hang (``dlcomm.heterogeneity.global_sync``).
"""
from __future__ import annotations

import atexit
import sys
import warnings
import weakref
from typing import Any

import torch

from dlcomm.heterogeneity.dssync import GroupCycle, average_in_group
from dlcomm.heterogeneity.global_sync import GlobalSyncPoints
from dlcomm.torch.compression_state import SYNC_STATE_KEY, pop_sync_state
from dlcomm.torch.fused_update import wrapped_step
from dlcomm.torch.schedules.base import build
from dlcomm.torch.tensor_bridge import to_numpy, write_back

# Every DS-Sync optimizer built in this process, in construction order (the same on every
# rank: construction is collective). Held strongly so that at exit every rank sees the same
# optimizers alive, whatever its garbage collector did.
_BUILT: list[DSSyncOptimizer] = []


class DSSyncOptimizer:
    """Mixin placed in front of the user's optimizer class (see ``schedules.base.build``)."""

    _optimizer_class: type

    def _setup(self, *, group_size: int, seed: int, cycle: int) -> None:
        self._cycle = GroupCycle(group_size, seed, cycle)
        self._params = [p for g in self.param_groups for p in g["params"]]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in self._params:
            if p.device.type != "cpu":
                raise ValueError("sync='dssync' averages CPU parameters; move the model to CPU")
            by_dtype.setdefault(p.dtype, []).append(p)
        self._by_dtype = list(by_dtype.values())
        self.sync_step = 0
        self._global = GlobalSyncPoints("DS-Sync")
        self._synced_at = 0  # steps done at the last global average (0: as broadcast)
        self._param_ids = {id(p) for p in self._params}
        self._holds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._was_training: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        ref = weakref.ref(self)

        def pre_hook(module: torch.nn.Module, args: Any) -> None:
            opt = ref()
            if opt is not None:
                opt._before_forward(module)

        self._forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)

    def _arrays(self, params: list[torch.Tensor]) -> list[Any]:
        return [to_numpy(p.data) for p in params]

    def step(self, closure: Any = None) -> Any:
        """Step on the local gradient, then average parameters within this step's group."""
        self._global.check(self.sync_step)
        result = wrapped_step(self, self._optimizer_class, closure)
        waiting = self._global.waiting_check(self.sync_step)
        with torch.no_grad():
            for params in self._by_dtype:
                arrays = average_in_group(self._arrays(params), self._cycle, self.sync_step,
                                          while_waiting=waiting)
                for p, a in zip(params, arrays):
                    write_back(p.data, a)
        self.sync_step += 1
        return result

    def synchronize(self) -> None:
        """Nothing to wait for: DS-Sync exchanges parameters after ``step()``."""

    def synchronize_globally(self) -> None:
        """Average the parameters over every rank (collective: every rank at the same step);
        nothing to do when no step ran since the last global average."""
        if self._synced_at == self.sync_step:
            return
        with torch.no_grad():
            groups = [self._arrays(params) for params in self._by_dtype]
            self._global.synchronize(self.sync_step, groups)
            for params, arrays in zip(self._by_dtype, groups):
                for p, a in zip(params, arrays):
                    write_back(p.data, a)
        self._synced_at = self.sync_step

    def state_dict(self) -> dict:
        """The wrapped optimizer's state, after the parameters are averaged over all ranks,
        and under ``dlcomm_sync`` DS-Sync's step (which picks every later step's groups).

        Collective (the global average). The wrapped optimizer's state (momentum) differs
        per rank under DS-Sync: each rank saves and loads its own."""
        self.synchronize_globally()
        state = self._optimizer_class.state_dict(self)
        state[SYNC_STATE_KEY] = {"mode": "dssync", "step": self.sync_step,
                                 "group_size": self._cycle.group_size,
                                 "seed": self._cycle.seed, "cycle": self._cycle.cycle}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what ``state_dict`` returned: the wrapped optimizer's state and DS-Sync's
        step. The parameters loaded with it count as globally averaged (they were, when the
        checkpoint was taken)."""
        state, sync_state = pop_sync_state(state_dict, "dssync", "DS-Sync",
                                           "the group shuffle starts again from step 0")
        if sync_state is None:
            step = 0
        else:
            step = sync_state.get("step")
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ValueError(f"DS-Sync state: step must be an int >= 0, got {step!r}")
            mine = {"group_size": self._cycle.group_size, "seed": self._cycle.seed,
                    "cycle": self._cycle.cycle}
            differ = {k: v for k, v in mine.items() if sync_state.get(k) != v}
            if differ:
                warnings.warn(f"the checkpoint's DS-Sync ran with other settings "
                              f"({ {k: sync_state.get(k) for k in differ} }, here {differ}): "
                              "the groups after resuming differ from the saved run's",
                              stacklevel=2)
        self._optimizer_class.load_state_dict(self, state)
        self.sync_step = step
        self._synced_at = step

    def group_ranks(self) -> list[int]:
        """The ranks this rank averages with at the coming step."""
        return self._cycle.group_ranks(self.sync_step)

    # --- where the model is read ---------------------------------------------------------
    def _before_forward(self, module: torch.nn.Module) -> None:
        holds = self._holds.get(module)
        if holds is None:
            holds = any(p is not None and id(p) in self._param_ids
                        for p in module._parameters.values())
            self._holds[module] = holds
            if holds:
                ref = weakref.ref(self)

                def state_dict_hook(module: torch.nn.Module, prefix: str, keep_vars: bool
                                    ) -> None:
                    opt = ref()
                    if opt is not None:
                        opt.synchronize_globally()

                module.register_state_dict_pre_hook(state_dict_hook)
        if not holds:
            return
        was_training = self._was_training.get(module, True)
        self._was_training[module] = module.training
        if was_training and not module.training:  # switched to evaluation mode
            self.synchronize_globally()


def _exit_synchronisation() -> None:
    """At interpreter exit: average every DS-Sync optimizer's model over all ranks, as at
    any other read point; a rank exiting with an uncaught exception tells the others."""
    # The transport imports mpi4py.MPI, which starts MPI: dlcomm.init did, not this import.
    from dlcomm.comm.world import finalized  # noqa: PLC0415 - MPI start-up

    if finalized():
        return
    failure = getattr(sys, "last_value", None)
    for opt in _BUILT:
        if opt._global.error is not None:
            continue
        if failure is not None:
            opt._global.leave(f"DS-Sync: rank {opt._global.rank} stopped with "
                              f"{type(failure).__name__}: {failure}, so it takes part in no "
                              "global average of the model")
            continue
        opt.synchronize_globally()


def make_dssync_optimizer(optimizer: torch.optim.Optimizer, group_size: int, seed: int = 0,
                          cycle: int = 8) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` for DS-Sync (collective: splits the cycle's group communicators)."""
    obj = build(DSSyncOptimizer, optimizer, group_size=group_size, seed=seed, cycle=cycle)
    if not _BUILT:
        atexit.register(_exit_synchronisation)
    _BUILT.append(obj)
    return obj
