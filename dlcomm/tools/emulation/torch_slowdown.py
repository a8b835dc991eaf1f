"""Spread an emulated compute straggler's delay over a torch model's forward and backward.

``ComputeSlowdown`` (``--heterogeneity compute=H:SPEED``) by default sleeps once, before each
block, for ``(1/speed - 1)`` x the previous block's CPU time. The slowed host then idles for
the first part of its step and computes at full speed for the rest, so its computation takes
turns with a fast host's instead of running beside it as a slower processor's would, and the
step after an LB-BSP re-size is delayed by the old batch's time. ``spread_over`` puts a
``tick`` at every leaf layer's forward (before and after) and at every parameter's gradient
(a tensor hook, which runs before the gradient is accumulated and so before dlcomm's
all-reduce hooks see it): each tick sleeps for the work done since the last one, so the host
computes throughout its block at ``speed`` and releases each gradient when a host at that
speed would.
"""
from __future__ import annotations

from typing import Any

import torch

from dlcomm.tools.emulation.compute_slowdown import ComputeSlowdown


def spread_over(slow: ComputeSlowdown, model: torch.nn.Module) -> list[Any]:
    """Register ``slow``'s ticks on ``model`` and switch it to spread mode.

    Returns the hook handles (``handle.remove()`` undoes them; switch back with
    ``slow.spread = False``). A no-op returning ``[]`` when ``slow`` is inactive (this rank is
    not slowed), so a script can call it on every rank.
    """
    if not isinstance(slow, ComputeSlowdown):
        raise TypeError(f"slow must be a ComputeSlowdown, got {type(slow).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not slow.active:
        return []

    def forward_tick(*_: Any) -> None:
        slow.tick()

    def grad_tick(_grad: torch.Tensor) -> None:
        slow.tick()  # returns None: the gradient is left as it is

    handles: list[Any] = []
    for module in model.modules():
        if next(module.children(), None) is None:  # leaf layers only: no double ticks
            handles.append(module.register_forward_pre_hook(forward_tick))
            handles.append(module.register_forward_hook(forward_tick))
    handles.extend(p.register_hook(grad_tick) for p in model.parameters() if p.requires_grad)
    slow.spread = True
    return handles
