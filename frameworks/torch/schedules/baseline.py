"""The ``none`` schedule: no overlap. Backward runs to the end untouched; ``step()`` then
all-reduces every gradient in one grouped call and steps the optimizer.

It is the baseline the overlapping schedules (``wfbp``, ``mgwfbp``, ``dear``) are measured
against: communication time adds to computation time instead of hiding behind it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from dlcomm.torch.schedules.base import ScheduleBase


class NoOverlapSchedule(ScheduleBase):
    """All-reduce after backward, in ``step()``: one grouped request for all gradients."""

    schedule_name = "none"

    def _start(self) -> None:
        self._should_synchronize = True
        self._synchronized = False

    def synchronize(self) -> None:
        """All-reduce every gradient now (one grouped request) and write it into ``.grad``."""
        if self._params:
            self._submit_allreduce(self._params, "all").finish()
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
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        result = self._base_step(closure)
        self._record_step_for_autotune()
        return result
