"""DLCP bounded loss for torch: after backward, the gradients (input layer first, as the
optimizer lists them) are flattened into one float32 buffer and averaged by
``dlcomm.heterogeneity.dlcp.BoundedLossExchange``, which may leave out at most ``loss_tolerance`` of
the elements per step (never of a bias, a norm or a small tensor); left-out data returns
through error feedback. The exchange starts after backward (no overlap with it).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from dlcomm.heterogeneity.dlcp import BoundedLossExchange, ExchangeStats
from dlcomm.torch.fused_update import wrapped_step
from dlcomm.torch.schedules.base import build


class BoundedLossOptimizer:
    """Mixin placed in front of the user's optimizer class (see ``schedules.base.build``)."""

    _optimizer_class: type

    def _setup(self, *, loss_tolerance: float) -> None:
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        for p in self._params:
            if p.device.type != "cpu":
                raise ValueError("loss_tolerance > 0 exchanges CPU gradients; move the model "
                                 "to CPU")
        min_size = int(os.environ.get("DLCOMM_DLCP_MIN_SIZE", "1024"))
        sizes = [p.numel() for p in self._params]
        protected = [p.dim() <= 1 or p.numel() < min_size for p in self._params]
        self._exchange = BoundedLossExchange(
            sizes, protected, loss_tolerance,
            chunk_elems=int(os.environ.get("DLCOMM_DLCP_CHUNK_ELEMS", "1024")),
            channels=int(os.environ.get("DLCOMM_DLCP_CHANNELS", "4")))
        self.protected = dict(zip(self._params, protected))
        self.exchange_stats: list[ExchangeStats] = []

    def synchronize(self) -> None:
        """Average the gradients with bounded loss and write them back into ``.grad``."""
        flat = np.concatenate([
            (p.grad.detach().float().reshape(-1).numpy() if p.grad is not None
             else np.zeros(p.numel(), np.float32)) for p in self._params])
        out, stats = self._exchange.exchange(np.ascontiguousarray(flat, dtype=np.float32))
        self.exchange_stats.append(stats)
        pos = 0
        for p in self._params:
            n = p.numel()
            value = torch.from_numpy(out[pos:pos + n]).reshape(p.shape).to(p.dtype)
            if p.grad is None:
                p.grad = value.clone()
            else:
                p.grad.copy_(value)
            pos += n

    def step(self, closure: Any = None) -> Any:
        """Exchange gradients with bounded loss, then step the wrapped optimizer."""
        self.synchronize()
        return wrapped_step(self, self._optimizer_class, closure)

    def drain(self) -> None:
        """Complete late receives and sends of the last exchange (no pending request left)."""
        self._exchange.drain()


def make_dlcp_optimizer(optimizer: torch.optim.Optimizer,
                        loss_tolerance: float) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` for bounded-loss gradient exchange (collective construction)."""
    return build(BoundedLossOptimizer, optimizer, loss_tolerance=loss_tolerance)
