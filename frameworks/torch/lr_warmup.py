"""Learning-rate warm-up with polynomial or cosine decay, the schedule large-batch training
uses with LARS/LAMB: start small while the large-batch gradients settle, reach the scaled base
rate after ``warmup_steps``, then decay to ``end_factor`` of it at ``total_steps``."""
from __future__ import annotations

import math

import torch


def warmup_decay_factor(step: int, warmup_steps: int, total_steps: int,
                        decay: str = "polynomial", power: float = 2.0,
                        end_factor: float = 0.0) -> float:
    """The learning-rate multiplier at ``step`` (0-based): linear warm-up from
    ``1/warmup_steps`` to 1 over ``warmup_steps``, then polynomial (``(1 - progress) **
    power``) or cosine decay to ``end_factor`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if decay == "polynomial":
        shape = (1.0 - progress) ** power
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return end_factor + (1.0 - end_factor) * shape


def warmup_lr_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                        decay: str = "polynomial", power: float = 2.0,
                        end_factor: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following ``warmup_decay_factor``; call its ``step()`` once per
    optimizer step. The usual large-batch recipe: the base rate scaled with the batch,
    reached after a few epochs of warm-up."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    for name, value in (("warmup_steps", warmup_steps), ("total_steps", total_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if total_steps < warmup_steps:
        raise ValueError(f"total_steps ({total_steps}) must be >= warmup_steps "
                         f"({warmup_steps})")
    if decay not in ("polynomial", "cosine"):
        raise ValueError(f"decay must be 'polynomial' or 'cosine', got {decay!r}")
    if not power > 0:
        raise ValueError(f"power must be > 0, got {power!r}")
    if not 0.0 <= end_factor <= 1.0:
        raise ValueError(f"end_factor must be in [0, 1], got {end_factor!r}")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_decay_factor(step, warmup_steps, total_steps, decay,
                                                    power, end_factor))
