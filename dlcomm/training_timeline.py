"""``timeline_range``: mark a span of the training loop (forward, backward, ...) in the
timeline that ``DLCOMM_TIMELINE`` writes, so its plot shows communication against compute.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dlcomm import basics

TRAINING_ROW = "(training)"


@contextmanager
def timeline_range(name: str, row: str = TRAINING_ROW) -> Iterator[None]:
    """Record the ``with`` block as phase ``name`` on timeline row ``row``.

    Costs nothing measurable when the timeline is off; needs ``init()`` first.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if not isinstance(row, str) or not row:
        raise ValueError(f"row must be a non-empty string, got {row!r}")
    with basics.state().engine.timeline.phase(row, name):
        yield
