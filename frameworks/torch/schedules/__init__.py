"""All-reduce schedules of ``dlcomm.torch.DistributedOptimizer``: when gradients travel.

* ``wfbp`` (default): each gradient is all-reduced as soon as backward produces it
  (``wfbp.py``);
* ``mgwfbp``: as wfbp, but layers are merged into fewer messages by MG-WFBP's rule on a
  measured alpha-beta cost model and profiled backward times (``mgwfbp.py``);
* ``dear``: reduce-scatter during backward, all-gather and per-bucket update during the
  next forward (``dear.py``);
* ``none``: one grouped all-reduce after backward, no overlap: the baseline (``baseline.py``).

Each is a ``ScheduleBase`` subclass (``mgwfbp`` extends ``wfbp``) made by the one builder
``base.build``. ``DistributedOptimizer(..., schedule=None)`` follows ``DLCOMM_SCHEDULE``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from dlcomm.config import parse_choice
from dlcomm.torch.schedules.base import ScheduleBase, build
from dlcomm.torch.schedules.baseline import NoOverlapSchedule
from dlcomm.torch.schedules.dear import DeARSchedule
from dlcomm.torch.schedules.mgwfbp import MGWFBPSchedule
from dlcomm.torch.schedules.wfbp import WFBPSchedule

SCHEDULE_CLASSES: dict[str, type[ScheduleBase]] = {
    "wfbp": WFBPSchedule, "mgwfbp": MGWFBPSchedule, "dear": DeARSchedule,
    "none": NoOverlapSchedule}
SCHEDULES = tuple(SCHEDULE_CLASSES)
DEFAULT_SCHEDULE = "wfbp"


def resolve_schedule(schedule: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The schedule name to use: ``schedule``, else ``DLCOMM_SCHEDULE``, else ``wfbp``.

    Case-insensitive; an unknown name raises ``ValueError`` listing the valid ones.
    """
    if schedule is None:
        env = os.environ if environ is None else environ
        schedule = env.get("DLCOMM_SCHEDULE", "") or DEFAULT_SCHEDULE
        source = "DLCOMM_SCHEDULE"
    else:
        source = "schedule="
    return parse_choice(schedule, SCHEDULES, what="schedule", source=source)


def make_scheduled_optimizer(schedule: str, optimizer: torch.optim.Optimizer,
                             named_parameters: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` with the schedule named ``schedule`` (one of ``SCHEDULES``).

    ``kwargs`` are the validated arguments of ``DistributedOptimizer``: ``compression``
    (resolved), ``backward_passes_per_step``, ``op``, ``gradient_predivide_factor``,
    ``groups`` (lists of parameters or None), ``sparse_as_dense``, ``process_set``.
    """
    if schedule not in SCHEDULE_CLASSES:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    return build(SCHEDULE_CLASSES[schedule], optimizer, named_parameters=named_parameters,
                 **kwargs)


__all__ = ["DEFAULT_SCHEDULE", "SCHEDULES", "SCHEDULE_CLASSES", "make_scheduled_optimizer",
           "resolve_schedule"]
