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
"""
from __future__ import annotations

import logging
import time
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
        self._groups = [[self._params[i] for i in group] for group in plan]
        self._group_of = {p: g for g, members in enumerate(self._groups) for p in members}
        self.merge_plan = [[self._parameter_names[p] for p in members] for members in self._groups]
        log.info("mgwfbp: alpha %.3g s, beta %.3g s/B; %d parameters in %d messages",
                 self.cost_model.alpha, self.cost_model.beta, len(self._params),
                 len(self._groups))

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
