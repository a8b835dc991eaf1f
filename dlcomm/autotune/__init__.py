"""Autotuning of the engine's fusion threshold and cycle time (``DLCOMM_AUTOTUNE=1``).

``autotuner_from_env()`` gives the process's ``Autotuner`` (configured by the
``DLCOMM_AUTOTUNE*`` knobs) to the first optimizer that asks, None otherwise; the optimizer
calls its ``step_finished()`` once per step on every rank. ``apply_settings`` is how new
values reach the engine.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dlcomm.autotune.settings import apply_settings, apply_to_running_engine, current_settings
from dlcomm.autotune.tuner import Autotuner
from dlcomm.basics import state
from dlcomm.config import KNOB_BY_NAME

_claimed = False


def autotuner_from_env(environ: Mapping[str, str] | None = None) -> Autotuner | None:
    """An ``Autotuner`` on the running engine if ``DLCOMM_AUTOTUNE`` is on and no optimizer
    of this process has one yet; None otherwise. Collective when it returns one."""
    global _claimed
    env = os.environ if environ is None else environ

    def knob(name: str) -> Any:
        k = KNOB_BY_NAME[name]
        raw = env.get(k.env)
        if raw is None:
            return k.default
        try:
            return k.parse(raw)
        except ValueError as exc:
            raise ValueError(f"bad value {raw!r} for {k.env}: {exc}") from None

    if not knob("autotune") or _claimed:
        return None
    st = state()
    _claimed = True
    log_path = knob("autotune_log").replace("{rank}", str(st.rank))
    return Autotuner(apply_to_running_engine, current_settings(st.engine), rank=st.rank,
                     warmup_steps=knob("autotune_warmup_steps"),
                     steps_per_sample=knob("autotune_steps_per_sample"),
                     max_samples=knob("autotune_max_samples"), log_path=log_path)


__all__ = ["Autotuner", "apply_settings", "apply_to_running_engine", "autotuner_from_env",
           "current_settings"]
