"""The ``none`` schedule: no overlap. Backward runs to the end untouched; ``step()`` then
all-reduces every gradient in one grouped call and steps the optimizer.

It is the baseline the overlapping schedules (``wfbp``, ``mgwfbp``, ``dear``) are measured
against: communication time adds to computation time instead of hiding behind it.
"""
from __future__ import annotations

from dlcomm.torch.schedules.base import ScheduleBase


class NoOverlapSchedule(ScheduleBase):
    """All-reduce after backward, in ``step()``: one grouped request for all gradients."""

    schedule_name = "none"

    def _start(self) -> None:
        pass

    def synchronize(self) -> None:
        """All-reduce every gradient now (one grouped request) and write it into ``.grad``."""
        if self._params and self._included:
            self._submit_allreduce(self._params, "all").wait()
        self._synchronized = True
