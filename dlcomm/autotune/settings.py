"""Change the engine's fusion threshold and cycle time while it runs.

The engine reads ``config.cycle_time`` at every cycle and ``executor.fusion_threshold``
whenever it plans a fusion, so replacing them from the user thread takes effect from the
next cycle. Fusion must be planned alike on every rank: call ``apply_settings`` on every
rank at the same point of the program, when none of its requests is in flight (between
optimizer steps).
"""
from __future__ import annotations

from typing import Any

from dlcomm.basics import state


def current_settings(engine: Any) -> tuple[int, float]:
    """``(fusion_threshold bytes, cycle_time ms)`` the engine uses now."""
    return int(engine.executor.fusion_threshold), float(engine.config.cycle_time)


def apply_settings(engine: Any, fusion_threshold: int, cycle_time: float) -> None:
    """Make ``engine`` fuse up to ``fusion_threshold`` bytes and cycle every ``cycle_time`` ms."""
    if isinstance(fusion_threshold, bool) or not isinstance(fusion_threshold, int) \
            or fusion_threshold < 0:
        raise ValueError(f"fusion_threshold must be an int >= 0 (bytes), got "
                         f"{fusion_threshold!r}")
    if isinstance(cycle_time, bool) or not isinstance(cycle_time, (int, float)) \
            or not cycle_time >= 0:
        raise ValueError(f"cycle_time must be a number >= 0 (milliseconds), got {cycle_time!r}")
    engine.set_tunables(fusion_threshold, float(cycle_time))


def apply_to_running_engine(fusion_threshold: int, cycle_time: float) -> None:
    """``apply_settings`` on the engine of the current ``dlcomm.init()``."""
    apply_settings(state().engine, fusion_threshold, cycle_time)
