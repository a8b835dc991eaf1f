"""dlcomm's state inside a torch optimizer checkpoint (issue 27).

``DistributedOptimizer.state_dict()`` stores the core compressor's ``state_dict`` (error
feedback residuals, low-rank factors, step counters, by request name) under
``COMPRESSION_STATE_KEY``, numpy arrays turned into torch tensors so that ``torch.save`` and
``torch.load(weights_only=True)`` carry it; loading turns them back. The schedule's state
(MG-WFBP's profile, cost model and merge plan) goes under ``SCHEDULE_STATE_KEY`` and the
synchronisation mode's (DS-Sync's step, LB-BSP's batch sizes and speed history) under
``SYNC_STATE_KEY``, both as plain Python values.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

COMPRESSION_STATE_KEY = "dlcomm_compression"
SCHEDULE_STATE_KEY = "dlcomm_schedule"
SYNC_STATE_KEY = "dlcomm_sync"
# Each rank keeps its own value of these when the optimizer state is broadcast: residuals,
# profiles and measured speeds differ per rank.
RANK_LOCAL_KEYS = (COMPRESSION_STATE_KEY, SCHEDULE_STATE_KEY, SYNC_STATE_KEY)


def to_torch(state: Any) -> Any:
    """``state`` with every numpy array replaced by a torch tensor (a copy)."""
    if isinstance(state, dict):
        return {k: to_torch(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(to_torch(v) for v in state)
    if isinstance(state, np.ndarray):
        return torch.from_numpy(state.copy())
    return state


def to_numpy(state: Any) -> Any:
    """``state`` with every torch tensor replaced by a numpy array (a copy, on the host)."""
    if isinstance(state, dict):
        return {k: to_numpy(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(to_numpy(v) for v in state)
    if isinstance(state, torch.Tensor):
        return state.detach().cpu().numpy().copy()
    return state


def pop_sync_state(state_dict: Any, mode: str, label: str, missing: str
                   ) -> tuple[dict, dict | None]:
    """Split an optimizer checkpoint into (the rest, the sync state of ``mode`` or None).

    A checkpoint without sync state warns, naming ``label`` and ``missing`` (what starts
    afresh); one of another sync mode raises ValueError: its state cannot drive this one."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict (from optimizer.state_dict()), got "
                        f"{type(state_dict).__name__}")
    state = dict(state_dict)
    sync_state = state.pop(SYNC_STATE_KEY, None)
    if sync_state is None:
        warnings.warn(f"the checkpoint holds no {label} state (saved without sync={mode!r}): "
                      f"{missing}", stacklevel=3)
    elif not isinstance(sync_state, dict) or sync_state.get("mode") != mode:
        found = (sync_state.get("mode") if isinstance(sync_state, dict)
                 else type(sync_state).__name__)
        raise ValueError(f"the checkpoint holds the state of sync mode {found!r}; this "
                         f"optimizer runs sync={mode!r}")
    return state, sync_state
