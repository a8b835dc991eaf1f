"""Synchronisation modes of ``dlcomm.torch.DistributedOptimizer`` for heterogeneous and
congested clusters (see docs/heterogeneity.md):

* ``bsp`` (default): every step averages gradients over all ranks (today's behaviour);
* ``dssync:group_size=S[,seed=0,cycle=8]``: DS-Sync, parameters averaged within shuffled
  groups of S ranks (``dssync.py``), and over all ranks where the model is read (eval mode,
  ``state_dict()``, ``synchronize_globally()``, the end of the script);
* ``lbbsp:global_batch=B[,min_batch=1,max_batch=B,predictor=ema,interval=8]``: LB-BSP, local
  batches re-sized every iteration; feed data with ``BalancedBatchSampler(n,
  optimizer.balancer)`` (``lbbsp.py``);
* ``loss_tolerance=p`` (> 0): DLCP bounded-loss exchange of gradients (``dlcp.py``).

Each mode is a mixin made by the schedules' builder (``schedules.base.build``): DS-Sync and
DLCP alone (they replace the gradient all-reduce), LB-BSP in front of the ``wfbp`` or ``none``
schedule. ``DistributedOptimizer(..., sync=None)`` follows ``DLCOMM_SYNC``;
``loss_tolerance=None`` follows ``DLCOMM_LOSS_TOLERANCE``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from dlcomm.basics import size
from dlcomm.torch.heterogeneity.dlcp import make_dlcp_optimizer
from dlcomm.torch.heterogeneity.dssync import make_dssync_optimizer
from dlcomm.torch.heterogeneity.lbbsp import BalancedBatchSampler, make_lbbsp_optimizer
from dlcomm.torch.schedules.base import build
from dlcomm.torch.schedules.wfbp import WFBPSchedule

SYNC_MODES = ("bsp", "dssync", "lbbsp")
_OPTIONS = {
    "bsp": {},
    "dssync": {"group_size": int, "seed": int, "cycle": int},
    "lbbsp": {"global_batch": int, "min_batch": int, "max_batch": int, "predictor": str,
              "interval": int},
}
_REQUIRED = {"dssync": ("group_size",), "lbbsp": ("global_batch",)}


def parse_sync(text: str) -> tuple[str, dict[str, Any]]:
    """``"dssync:group_size=2,seed=1"`` -> ``("dssync", {"group_size": 2, "seed": 1})``."""
    if not isinstance(text, str):
        raise TypeError(f"sync must be a str such as 'dssync:group_size=2', got "
                        f"{type(text).__name__}")
    name, _, rest = text.strip().partition(":")
    name = name.strip().lower() or "bsp"
    if name not in SYNC_MODES:
        raise ValueError(f"unknown sync mode {name!r}; valid: {', '.join(SYNC_MODES)} "
                         "(e.g. 'dssync:group_size=2', 'lbbsp:global_batch=256')")
    options: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _OPTIONS[name]:
            raise ValueError(f"bad option {item!r} for sync mode {name!r}; options: "
                             f"{', '.join(_OPTIONS[name]) or 'none'} as key=value")
        try:
            options[key] = _OPTIONS[name][key](value.strip())
        except ValueError:
            raise ValueError(f"sync option {key} needs a {_OPTIONS[name][key].__name__}, got "
                             f"{value!r}") from None
    missing = [k for k in _REQUIRED.get(name, ()) if k not in options]
    if missing:
        raise ValueError(f"sync mode {name!r} needs {', '.join(missing)} (e.g. "
                         f"'{name}:{missing[0]}=...')")
    return name, options


def resolve_sync(sync: str | None, environ: Mapping[str, str] | None = None
                 ) -> tuple[str, dict[str, Any]]:
    """``sync``, else ``DLCOMM_SYNC``, else ``bsp``, parsed by ``parse_sync``."""
    if sync is None:
        env = os.environ if environ is None else environ
        sync = env.get("DLCOMM_SYNC", "") or "bsp"
    return parse_sync(sync)


def resolve_loss_tolerance(loss_tolerance: float | None,
                           environ: Mapping[str, str] | None = None) -> float:
    """``loss_tolerance``, else ``DLCOMM_LOSS_TOLERANCE``, else 0; must be in [0, 1)."""
    if loss_tolerance is None:
        env = os.environ if environ is None else environ
        loss_tolerance = float(env.get("DLCOMM_LOSS_TOLERANCE", "") or 0.0)
    if isinstance(loss_tolerance, bool) or not isinstance(loss_tolerance, (int, float)):
        raise TypeError(f"loss_tolerance must be a float, got {type(loss_tolerance).__name__}")
    if not 0.0 <= loss_tolerance < 1.0:
        raise ValueError(f"loss_tolerance must be in [0, 1) (a fraction: 0.05 = 5%), got "
                         f"{loss_tolerance}")
    return float(loss_tolerance)


class EveryRankDSSync:
    """DS-Sync whose group holds every rank is BSP (the default schedule); the parameters are
    identical on every rank, so ``synchronize_globally()`` has nothing to do."""

    def synchronize_globally(self) -> None:
        """Nothing to do: every step averaged over all ranks."""


def make_sync_optimizer(mode: str, options: dict[str, Any], loss_tolerance: float,
                        optimizer: torch.optim.Optimizer, schedule: str,
                        **schedule_options: Any) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` for ``mode`` (not ``bsp``) or for ``loss_tolerance > 0``.

    ``schedule`` is DistributedOptimizer's schedule (LB-BSP takes ``wfbp`` or ``none``; DS-Sync
    with ``group_size >= size()`` is BSP with it); ``schedule_options`` are its validated
    arguments (``named_parameters``, ``compression``, ...).
    """
    if mode != "bsp" and loss_tolerance > 0:
        raise ValueError(f"loss_tolerance applies to sync='bsp'; got sync={mode!r} too")
    if loss_tolerance > 0:
        return make_dlcp_optimizer(optimizer, loss_tolerance)
    if mode == "dssync":
        if options["group_size"] >= size():
            return build((EveryRankDSSync, WFBPSchedule), optimizer, **schedule_options)
        return make_dssync_optimizer(optimizer, **options)
    if mode == "lbbsp":
        return make_lbbsp_optimizer(optimizer, options, schedule=schedule, **schedule_options)
    raise ValueError(f"unknown sync mode {mode!r}")


__all__ = ["SYNC_MODES", "BalancedBatchSampler", "make_sync_optimizer", "parse_sync",
           "resolve_loss_tolerance", "resolve_sync"]
