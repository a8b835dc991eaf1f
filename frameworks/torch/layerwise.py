"""LARS and LAMB: optimizers that scale each layer's step by a trust ratio, for very large
batches.

With a large global batch (many ranks, or gradient accumulation) one learning rate fits some
layers and blows up others; both optimizers give each parameter tensor the ratio of its
weight norm to its update norm, so every layer moves by a similar relative amount (You et
al., LARS 2017, LAMB 2019). A parameter group's ``trust_ratio`` key says whether its
parameters get the ratio: True, False, or None (the default: tensors of two or more
dimensions do, biases and other 1-D tensors do not). ``exclude_bias_and_norm`` builds the
usual two groups (no weight decay and no ratio for biases and normalisation layers). Both are
ordinary ``torch.optim.Optimizer`` classes, so ``DistributedOptimizer`` wraps them with any
schedule and compressor; ``lr_warmup`` has the warm-up and decay they are used with.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

_NORM_LAYERS = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm,
                torch.nn.LocalResponseNorm)


def exclude_bias_and_norm(model: torch.nn.Module, weight_decay: float = 0.0
                          ) -> list[dict[str, Any]]:
    """Two parameter groups of ``model``: weights of linear/convolution layers (weight decay,
    trust ratio) and biases plus normalisation parameters (neither)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    adapted, excluded, seen = [], [], set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(module, _NORM_LAYERS) or name == "bias" or p.ndim <= 1:
                excluded.append(p)
            else:
                adapted.append(p)
    return [{"params": adapted, "weight_decay": weight_decay, "trust_ratio": True},
            {"params": excluded, "weight_decay": 0.0, "trust_ratio": False}]


def _adapts(group: dict[str, Any], p: torch.Tensor) -> bool:
    choice = group.get("trust_ratio")
    return p.ndim > 1 if choice is None else bool(choice)


def _check_common(lr: float, weight_decay: float, eps: float) -> None:
    if not lr >= 0:
        raise ValueError(f"lr must be >= 0, got {lr!r}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")


class LARS(torch.optim.Optimizer):
    """SGD with momentum whose update of each adapted tensor ``w`` is scaled by
    ``trust_coefficient * |w| / (|g| + weight_decay * |w| + eps)`` (1 when either norm is 0).

    Per tensor: ``d = g + weight_decay * w``; ``d *= ratio`` if adapted;
    ``buf = momentum * buf + d`` (``d`` at the first step); ``w -= lr * buf``.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.1, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = 0.001,
                 eps: float = 1e-8, trust_ratio: bool | None = None) -> None:
        _check_common(lr, weight_decay, eps)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if not trust_coefficient > 0:
            raise ValueError(f"trust_coefficient must be > 0, got {trust_coefficient!r}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps,
                                      trust_ratio=trust_ratio))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            wd, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                w = p.float()
                d = g.add(w, alpha=wd) if wd else g.clone()
                if _adapts(group, p):
                    w_norm, g_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
                    ratio = group["trust_coefficient"] * w_norm / (
                        g_norm + wd * w_norm + group["eps"])
                    d.mul_(torch.where((w_norm > 0) & (g_norm > 0), ratio,
                                       torch.ones_like(ratio)))
                if momentum:
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        state["momentum_buffer"] = buf = d
                    else:
                        buf.mul_(momentum).add_(d)
                    d = buf
                p.add_(d.to(p.dtype), alpha=-group["lr"])
        return loss


class LAMB(torch.optim.Optimizer):
    """Adam whose update of each adapted tensor ``w`` is scaled by ``|w| / |r|``, where ``r``
    is Adam's bias-corrected step plus ``weight_decay * w`` (1 when either norm is 0).

    Per tensor: ``m, v`` Adam's moments; ``r = m_hat / (sqrt(v_hat) + eps) + weight_decay *
    w``; ``w -= lr * ratio * r``.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, trust_ratio: bool | None = None) -> None:
        _check_common(lr, weight_decay, eps)
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, trust_ratio=trust_ratio))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            wd = group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                w = p.float()
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(w)
                    state["exp_avg_sq"] = torch.zeros_like(w)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                m_hat = m / (1 - beta1 ** t)
                v_hat = v / (1 - beta2 ** t)
                r = m_hat / (v_hat.sqrt() + group["eps"])
                if wd:
                    r.add_(w, alpha=wd)
                if _adapts(group, p):
                    w_norm, r_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(r)
                    ratio = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm,
                                        torch.ones_like(w_norm))
                    r.mul_(ratio)
                p.add_(r.to(p.dtype), alpha=-group["lr"])
        return loss
