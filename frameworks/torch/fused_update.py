"""The fused parameter update: the wrapped optimizer updates all tensors of a parameter group
in one multi-tensor pass instead of a small update per tensor.

This is the public-cloud top-k seed's "parallel tensor operator" for the model update. torch
now has it: the ``foreach`` implementations (one call per operation over a list of tensors)
and the ``fused`` kernels (one kernel for the whole update). ``DLCOMM_FUSED_UPDATE`` picks:

- ``off`` (default): the optimizer steps as the user built it (torch's own default: the
  per-tensor loop on CPU, ``foreach`` on GPU).
- ``foreach``: torch's multi-tensor path for every optimizer that has it; bitwise equal to
  the per-tensor loop (``tests/unit/test_fused_update.py``).
- ``fused``: torch's fused kernel wherever the optimizer and the device have one (SGD, Adam,
  AdamW, Adagrad), else ``foreach``. It rounds differently from the loop (float32 SGD with
  momentum by an ulp here and there; half precision is computed in float32), and is the fast
  one on CPU (docs/compression.md has the figures). A step in which a gradient is sparse
  (an embedding with ``sparse=True``), which the fused kernels refuse, runs through
  ``foreach`` instead.

A group whose ``foreach`` or ``fused`` the user set is left alone, as are ``differentiable``
groups and optimizers with neither option (they step per tensor: there is no native kernel of
ours behind this).
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch

FUSED_UPDATE_MODES = ("off", "foreach", "fused")


def resolve_fused_update(mode: str | None) -> str:
    """``mode``, else ``DLCOMM_FUSED_UPDATE``, validated (one of ``FUSED_UPDATE_MODES``)."""
    from dlcomm.config import knob_value, parse_choice  # noqa: PLC0415 - reads the environment

    source = "fused_update="
    if mode is None:
        mode, source = knob_value("fused_update"), "DLCOMM_FUSED_UPDATE"
    return parse_choice(mode, FUSED_UPDATE_MODES, what="fused update mode", source=source)


def _options(optimizer_class: type) -> set[str]:
    """Which of ``foreach`` and ``fused`` the optimizer's constructor takes."""
    try:
        parameters = inspect.signature(optimizer_class.__init__).parameters
    except (TypeError, ValueError):
        return set()
    return {name for name in ("foreach", "fused") if name in parameters}


def _fused_supported(params: list[torch.Tensor]) -> bool:
    """torch's own condition for a fused kernel: floating-point dense tensors on a device
    that has the kernels."""
    from torch.utils._foreach_utils import (  # noqa: PLC0415 - private helper, used here only
        _get_fused_kernels_supported_devices,
    )

    devices = set(_get_fused_kernels_supported_devices())
    return all(p.device.type in devices and torch.is_floating_point(p) and not p.is_sparse
               for p in params)


def configure_update(optimizer: torch.optim.Optimizer, optimizer_class: type,
                     mode: str) -> str:
    """Set each parameter group of ``optimizer`` (an instance of ``optimizer_class`` or of a
    class built on it) to update its tensors together, as ``mode`` says.

    Returns what its groups use: ``fused``, ``foreach``, ``per-tensor``, ``user`` (the
    user's own setting kept) or several of these joined by ``+``.
    """
    if mode not in FUSED_UPDATE_MODES:
        raise ValueError(f"unknown fused update mode {mode!r}; valid: "
                         f"{', '.join(FUSED_UPDATE_MODES)}")
    options = _options(optimizer_class)
    used = []
    for group in optimizer.param_groups:
        used.append(_configure_group(group, options, mode))
    return "+".join(dict.fromkeys(used)) or "per-tensor"


def _configure_group(group: dict, options: set[str], mode: str) -> str:
    if group.get("foreach") or group.get("fused"):
        return "user"
    if mode == "off" or not options:
        return "per-tensor"
    if group.get("foreach") is False or group.get("fused") is False:
        return "user"  # the user asked for the per-tensor loop
    if group.get("differentiable"):
        return "per-tensor"
    if mode == "fused" and "fused" in options and _fused_supported(group["params"]):
        group["fused"] = True
        if "foreach" in group:
            group["foreach"] = False
        return "fused"
    if "foreach" in options:
        group["foreach"] = True
        return "foreach"
    return "per-tensor"


@contextlib.contextmanager
def sparse_steps_unfused(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Inside, the fused groups that hold a sparse gradient step through ``foreach``."""
    switched = [g for g in optimizer.param_groups if g.get("fused") and any(
        p.grad is not None and p.grad.is_sparse for p in g["params"])]
    for group in switched:
        group["fused"], group["foreach"] = False, True
    try:
        yield
    finally:
        for group in switched:
            group["fused"], group["foreach"] = True, False


def wrapped_step(optimizer: torch.optim.Optimizer, optimizer_class: type,
                 closure: object = None) -> object:
    """``optimizer_class.step`` on ``optimizer``, sparse gradients kept off fused kernels."""
    with sparse_steps_unfused(optimizer):
        return optimizer_class.step(optimizer, closure)
