"""``SyncBatchNorm``: batch normalisation with statistics over the whole global batch."""
from __future__ import annotations

import itertools
from typing import Any

import torch

import dlcomm
from dlcomm.torch import mpi_ops

_layer_ids = itertools.count()


class _SyncBatchNormFunction(torch.autograd.Function):
    """Forward and backward with sums all-reduced over ranks (one message each way)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, eps: float, name: str) -> tuple[torch.Tensor, ...]:
        dims = [0] + list(range(2, x.dim()))
        local_count = x.numel() // x.size(1)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims),
                           torch.tensor([float(local_count)], dtype=x.dtype)]).double()
        stats = mpi_ops.allreduce(stats, name=f"{name}.forward", op=dlcomm.Sum)
        c = x.size(1)
        count = stats[-1]
        mean = (stats[:c] / count).to(x.dtype)
        var = (stats[c:2 * c] / count - (stats[:c] / count) ** 2).clamp_min(0).to(x.dtype)
        invstd = torch.rsqrt(var + eps)
        shape = [1, c] + [1] * (x.dim() - 2)
        xhat = (x - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.view(shape)
        if bias is not None:
            y = y + bias.view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.count = float(count)
        ctx.name = name
        ctx.has_bias = bias is not None
        return y, mean, var, count

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, *_: Any) -> tuple[Any, ...]:
        xhat, invstd, weight = ctx.saved_tensors
        dims = [0] + list(range(2, dy.dim()))
        c = dy.size(1)
        shape = [1, c] + [1] * (dy.dim() - 2)
        local = torch.cat([dy.sum(dims), (dy * xhat).sum(dims)])
        grad_bias_local, grad_weight_local = local[:c].clone(), local[c:].clone()
        total = mpi_ops.allreduce(local, name=f"{ctx.name}.backward", op=dlcomm.Sum)
        sum_dy, sum_dy_xhat = total[:c], total[c:]
        w = weight.view(shape) if weight is not None else 1.0
        dx = (dy - (sum_dy.view(shape) + xhat * sum_dy_xhat.view(shape)) / ctx.count)
        dx = dx * invstd.view(shape) * w
        grad_weight = grad_weight_local if weight is not None else None
        grad_bias = grad_bias_local if ctx.has_bias else None
        return dx, grad_weight, grad_bias, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Drop-in for ``torch.nn.BatchNorm*d`` whose training statistics span all ranks.

    Weight and bias gradients stay local (the optimizer averages them like any gradient).
    In eval mode, or on one rank, it is ordinary batch norm.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self._name = f"sync_batch_norm.{next(_layer_ids)}"

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (N, C, ...), got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training or dlcomm.size() == 1:
            return super().forward(x)
        if x.size(1) != self.num_features:
            raise ValueError(f"expected {self.num_features} channels, got {x.size(1)}")
        y, mean, var, count = _SyncBatchNormFunction.apply(
            x, self.weight, self.bias, self.eps, self._name)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                            else self.momentum)
                unbiased = var * (count / max(count - 1, 1))
                self.running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased.detach().to(
                    self.running_var.dtype))
        return y
