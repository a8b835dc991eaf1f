"""The ``mgwfbp`` schedule: wait-free backpropagation with merged gradients (MG-WFBP,
Shi et al.).

WFBP sends every layer's gradient as soon as it exists, paying the all-reduce start-up
cost ``alpha`` once per layer. MG-WFBP merges a layer into the message of the layers before
it when that finishes the communication no later: when the link would still be busy with
earlier messages by the time the layer's gradient is ready, or when the ``alpha`` saved
outweighs the wait. It needs two measurements, both agreed across ranks:

* ``alpha`` and ``beta`` of ``time = alpha + beta * bytes``, fitted at start-up on timed
  all-reduces (rank 0's fit is broadcast), and
* when each gradient becomes ready during backward, profiled with hook timestamps over the
  first iterations (averaged over ranks).

Until the plan exists (the first ``PROFILE_STEPS`` steps) it behaves exactly as ``wfbp``.

The plan depends on timings, so a new process would plan differently: ``state_dict()``
carries the step count, the profile so far, the cost model and the plan (by parameter
name), and ``load_state_dict()`` restores them, so a resumed run sends the same messages.
"""
from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Sequence

import torch

from dlcomm.torch import mpi_ops
from dlcomm.torch.functions import broadcast_object
from dlcomm.torch.schedules.base import ScheduleBase
from dlcomm.torch.schedules.cost_model import AlphaBeta, agreed_alpha_beta
from dlcomm.torch.schedules.wfbp import WFBPSchedule

log = logging.getLogger("dlcomm")

PROFILE_STEPS = 3  # steps timed before planning; the first is a warm-up and is not used


def simulate_finish_time(groups: Sequence[Sequence[int]], ready_times: Sequence[float],
                         sizes: Sequence[float], model: AlphaBeta) -> float:
    """When the last all-reduce of ``groups`` ends, one message at a time on the link.

    ``ready_times[i]`` is when gradient ``i`` exists, ``sizes[i]`` its bytes; a group's
    message starts once the link is free and its last gradient is ready.
    """
    link_free = 0.0
    for group in groups:
        if not group:
            raise ValueError("groups must not be empty")
        start = max(link_free, max(ready_times[i] for i in group))
        link_free = start + model.time(sum(sizes[i] for i in group))
    return link_free


def plan_merged_groups(ready_times: Sequence[float], sizes: Sequence[float],
                       model: AlphaBeta) -> list[list[int]]:
    """MG-WFBP's merge: consecutive gradients (in backward order) grouped into messages.

    Walks the gradients in the order they become ready and adds gradient ``j`` to the open
    message when sending them together ends no later than sending the open message first
    and ``j`` after it. Returns lists of indices into ``ready_times``/``sizes``, which must
    be in backward order (``ready_times`` non-decreasing).
    """
    if len(ready_times) != len(sizes):
        raise ValueError(f"ready_times and sizes differ in length: {len(ready_times)} and "
                         f"{len(sizes)}")
    if any(b < a for a, b in zip(ready_times, ready_times[1:])):
        raise ValueError("ready_times must be non-decreasing (gradients in backward order)")
    if any(s < 0 for s in sizes):
        raise ValueError("sizes must be >= 0")
    if not ready_times:
        return []
    groups: list[list[int]] = []
    link_free = 0.0
    current, current_bytes, current_ready = [0], float(sizes[0]), float(ready_times[0])
    for j in range(1, len(sizes)):
        end_current = max(link_free, current_ready) + model.time(current_bytes)
        separate = max(end_current, ready_times[j]) + model.time(sizes[j])
        merged = max(link_free, ready_times[j]) + model.time(current_bytes + sizes[j])
        if merged <= separate:
            current.append(j)
            current_bytes += sizes[j]
            current_ready = float(ready_times[j])
        else:
            groups.append(current)
            link_free = end_current
            current, current_bytes, current_ready = [j], float(sizes[j]), float(ready_times[j])
    groups.append(current)
    return groups


class MGWFBPSchedule(WFBPSchedule):
    """Per-parameter hooks as in ``wfbp``; after profiling, merged groups as planned."""

    schedule_name = "mgwfbp"
    _request_prefix = ScheduleBase._request_prefix
    _synchronize_for_step = ScheduleBase._synchronize_for_step

    def _start(self) -> None:
        if self._user_groups:
            raise ValueError("schedule='mgwfbp' plans its own groups; do not pass groups= or "
                             "num_groups= (use schedule='wfbp' for fixed groups)")
        super()._start()
        self._steps = 0
        self._step_origin: float | None = None
        self._ready_at: dict[torch.Tensor, float] = {}
        self._profile: list[dict[torch.Tensor, float]] = []
        self.cost_model: AlphaBeta | None = None
        self.merge_plan: list[list[str]] | None = None  # parameter names per message

    def _gradient_ready(self, p: torch.Tensor) -> None:
        now = time.perf_counter()
        if self._step_origin is None:
            self._step_origin = now
        self._ready_at[p] = now - self._step_origin
        super()._gradient_ready(p)

    def _group_name(self, group: int) -> str:
        return f"group{group}"

    # --- planning ------------------------------------------------------------------------
    def _plan(self) -> None:
        """Agree on ready times and alpha/beta, merge, and switch to the merged groups."""
        used = self._profile[1:] or self._profile
        last = max((t for prof in used for t in prof.values()), default=0.0)
        local = torch.tensor([sum(prof.get(p, last) for prof in used) / len(used)
                              for p in self._params], dtype=torch.float64)
        ready = mpi_ops.allreduce(local, name=f"{self._prefix}.profile",
                                  process_set=self._process_set)
        self.cost_model = agreed_alpha_beta(process_set=self._process_set,
                                            name=f"{self._prefix}.costmodel")
        order = sorted(range(len(self._params)), key=lambda i: (float(ready[i]), -i))
        sizes = [self._params[i].numel() * self._params[i].element_size() for i in order]
        plan = plan_merged_groups([float(ready[i]) for i in order], sizes, self.cost_model)
        plan = [[order[k] for k in group] for group in plan]
        plan = broadcast_object(plan, root_rank=0, name=f"{self._prefix}.plan",
                                process_set=self._process_set)
        self._use_groups([[self._params[i] for i in group] for group in plan])
        log.info("mgwfbp: alpha %.3g s, beta %.3g s/B; %d parameters in %d messages",
                 self.cost_model.alpha, self.cost_model.beta, len(self._params),
                 len(self._groups))

    def _use_groups(self, groups: list[list[torch.Tensor]]) -> None:
        """Send these groups of parameters as one message each from now on."""
        self._groups = groups
        self._group_of = {p: g for g, members in enumerate(groups) for p in members}
        self._ready_in_group = {}
        self.merge_plan = ([[self._parameter_names[p] for p in members] for members in groups]
                           if groups else None)

    # --- checkpoints -----------------------------------------------------------------------
    def _schedule_state(self) -> dict:
        """Steps done, the profile so far, the cost model and the plan, by parameter name."""
        names = self._parameter_names
        return {
            "schedule": self.schedule_name,
            "steps": self._steps,
            "profile": [{names[p]: float(t) for p, t in prof.items()} for prof in self._profile],
            "cost_model": (None if self.cost_model is None
                           else [float(self.cost_model.alpha), float(self.cost_model.beta)]),
            "merge_plan": None if self.merge_plan is None else [list(g) for g in self.merge_plan],
        }

    def _load_schedule_state(self, state: dict | None) -> None:
        if state is None:
            if self._steps or self.merge_plan is not None:
                warnings.warn("the checkpoint holds no MG-WFBP state (saved by another "
                              "schedule or a plain optimizer): this optimizer keeps its own "
                              "profile and plan", stacklevel=3)
            else:
                warnings.warn("the checkpoint holds no MG-WFBP state (saved by another "
                              "schedule or a plain optimizer): the merge plan is profiled "
                              "afresh, so the resumed run may send other messages",
                              stacklevel=3)
            return
        if not isinstance(state, dict) or state.get("schedule") != self.schedule_name:
            found = state.get("schedule") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"the checkpoint's schedule state is {found!r}'s; this optimizer "
                             f"runs schedule={self.schedule_name!r}")
        by_name = {n: p for p, n in self._parameter_names.items()}
        trainable = set(self._params)

        def param(name: object) -> torch.Tensor:
            p = by_name.get(name) if isinstance(name, str) else None
            if p is None or p not in trainable:
                raise ValueError(f"the checkpoint's MG-WFBP state names parameter {name!r}, "
                                 "which this optimizer does not train; build the optimizer "
                                 "with the same named_parameters as the run that saved it")
            return p

        steps = state.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"MG-WFBP state: steps must be an int >= 0, got {steps!r}")
        profile = [{param(n): float(t) for n, t in prof.items()}
                   for prof in state.get("profile") or []]
        cost = state.get("cost_model")
        if cost is not None and (len(cost) != 2 or not all(
                math.isfinite(float(v)) and float(v) >= 0 for v in cost)):
            raise ValueError(f"MG-WFBP state: cost_model must be [alpha, beta] >= 0, got {cost!r}")
        plan = state.get("merge_plan")
        groups: list[list[torch.Tensor]] = []
        if plan is not None:
            groups = [[param(n) for n in names] for names in plan]
            flat = [p for g in groups for p in g]
            if len(flat) != len(set(flat)) or set(flat) != trainable or not all(groups):
                raise ValueError("the checkpoint's MG-WFBP merge plan does not cover this "
                                 "optimizer's parameters exactly once each; build the "
                                 "optimizer on the same model as the run that saved it")
        elif steps >= PROFILE_STEPS:
            raise ValueError(f"MG-WFBP state: {steps} steps done but no merge plan")
        self._steps = steps
        self._profile = profile
        self.cost_model = None if cost is None else AlphaBeta(float(cost[0]), float(cost[1]))
        self._use_groups(groups)
        self._ready_at.clear()
        self._step_origin = None

    # --- optimizer API -------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for every gradient's all-reduce and write the results into ``.grad``; the
        first ``PROFILE_STEPS`` calls also record when each gradient was ready."""
        super().synchronize()
        if not self._included:
            return
        self._steps += 1
        if self._steps <= PROFILE_STEPS:
            self._profile.append(dict(self._ready_at))
            if self._steps == PROFILE_STEPS:
                self._plan()
        self._ready_at.clear()
        self._step_origin = None
