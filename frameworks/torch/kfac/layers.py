"""The torch modules K-FAC preconditions (``Linear``, ``Conv2d``): their factors from hook
tensors, their gradient as one matrix, and what each registered layer holds between steps.

Tensors become numpy views of the same memory (CPU); the maths is ``dlcomm.kfac``'s.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dlcomm.kfac import factors as kf
from dlcomm.torch.tensor_bridge import to_numpy


class KFACLayer:
    """One registered module: its factor dimensions, running factors, inverses, and the
    factor all-reduces in flight."""

    kind = "layer"

    def __init__(self, name: str, module: torch.nn.Module, factor_dtype: np.dtype) -> None:
        self.name = name
        self.module = module
        self.factor_dtype = factor_dtype
        self.has_bias = getattr(module, "bias", None) is not None
        self.a_dim, self.g_dim = self._dims()
        # running averages (numpy, symmetric), None until the first update
        self.factors: dict[str, np.ndarray | None] = {"A": None, "G": None}
        # local batch factors summed over micro-batches, and how many
        self.batch: dict[str, np.ndarray | None] = {"A": None, "G": None}
        self.batch_count = {"A": 0, "G": 0}
        # factor all-reduces submitted this step: (tensor, handle)
        self.pending: dict[str, list[tuple[torch.Tensor, Any]]] = {"A": [], "G": []}
        # second-order results: inverses ("A", "G") or eigen ("QA", "dA", "QG", "dG", "scale")
        self.second_order: dict[str, np.ndarray] = {}

    def _dims(self) -> tuple[int, int]:
        raise NotImplementedError

    def input_factor(self, x: torch.Tensor) -> np.ndarray:
        raise NotImplementedError

    def output_factor(self, grad: torch.Tensor) -> np.ndarray:
        raise NotImplementedError

    def _array(self, tensor: torch.Tensor) -> np.ndarray:
        array = to_numpy(tensor)
        if array.dtype != self.factor_dtype:
            array = array.astype(self.factor_dtype)
        return array

    def add_to_batch(self, factor: str, value: np.ndarray) -> int:
        """Sum a micro-batch's factor locally; returns how many are summed now."""
        current = self.batch[factor]
        if current is None:
            self.batch[factor] = value
        else:
            current += value
        self.batch_count[factor] += 1
        return self.batch_count[factor]

    def take_batch(self, factor: str) -> np.ndarray | None:
        """The mean of the summed micro-batch factors (None if none), and reset."""
        value, count = self.batch[factor], self.batch_count[factor]
        self.batch[factor], self.batch_count[factor] = None, 0
        if value is None:
            return None
        if count > 1:
            value *= value.dtype.type(1.0 / count)
        return value

    def grad_matrix(self) -> np.ndarray | None:
        """The weight gradient as (out, in...) with the bias gradient as a last column;
        None when the weight has no gradient."""
        weight = self.module.weight
        if weight.grad is None:
            return None
        w = to_numpy(weight.grad).reshape(self.g_dim, -1)
        if not self.has_bias:
            return w
        out = np.empty((self.g_dim, self.a_dim), dtype=w.dtype)
        out[:, :-1] = w
        bias = self.module.bias.grad
        out[:, -1] = 0 if bias is None else to_numpy(bias)
        return out

    def set_grad(self, matrix: np.ndarray) -> None:
        """Write ``matrix`` (from ``grad_matrix``'s layout) into the parameters' gradients."""
        weight = self.module.weight
        if weight.grad is None:
            return
        source = torch.from_numpy(np.ascontiguousarray(matrix[:, :-1] if self.has_bias
                                                       else matrix))
        weight.grad.copy_(source.reshape(weight.shape))
        if self.has_bias and self.module.bias.grad is not None:
            self.module.bias.grad.copy_(torch.from_numpy(np.ascontiguousarray(matrix[:, -1])))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, A {self.a_dim}x{self.a_dim}, " \
               f"G {self.g_dim}x{self.g_dim})"


class LinearLayer(KFACLayer):
    kind = "linear"

    def _dims(self) -> tuple[int, int]:
        return self.module.in_features + int(self.has_bias), self.module.out_features

    def input_factor(self, x: torch.Tensor) -> np.ndarray:
        return kf.linear_input_factor(self._array(x), self.has_bias)

    def output_factor(self, grad: torch.Tensor) -> np.ndarray:
        return kf.linear_output_factor(self._array(grad))


class Conv2dLayer(KFACLayer):
    kind = "conv2d"

    def _dims(self) -> tuple[int, int]:
        m = self.module
        kh, kw = m.kernel_size
        return m.in_channels * kh * kw + int(self.has_bias), m.out_channels

    def input_factor(self, x: torch.Tensor) -> np.ndarray:
        m = self.module
        padding = (0, 0) if m.padding == "valid" else m.padding
        return kf.conv2d_input_factor(self._array(x), self.has_bias, m.kernel_size, m.stride,
                                      padding, m.dilation)

    def output_factor(self, grad: torch.Tensor) -> np.ndarray:
        return kf.conv2d_output_factor(self._array(grad))


def unsupported_reason(module: torch.nn.Module) -> str | None:
    """Why a Linear/Conv2d module cannot be preconditioned here, or None if it can."""
    if isinstance(module, torch.nn.Conv2d):
        if module.groups != 1:
            return f"grouped convolution (groups={module.groups})"
        if module.padding_mode != "zeros":
            return f"padding_mode={module.padding_mode!r} (only zero padding)"
        if module.padding == "same":
            return "padding='same' (give the padding as numbers)"
    return None


def _matches(text: str, patterns: Sequence[re.Pattern]) -> bool:
    return any(p.search(text) for p in patterns)


def register_layers(model: torch.nn.Module, skip_layers: Sequence[str],
                    factor_dtype: np.dtype) -> list[KFACLayer]:
    """The model's leaf ``Linear`` and ``Conv2d`` modules whose parameters all require
    gradients, in ``named_modules`` order, except those whose name or class name matches a
    ``skip_layers`` regular expression (``re.search``, as kfac-pytorch)."""
    patterns = []
    for pattern in skip_layers:
        try:
            patterns.append(re.compile(pattern))
        except re.error as exc:
            raise ValueError(f"skip_layers pattern {pattern!r} is not a regular expression: "
                             f"{exc}") from None
    layers: list[KFACLayer] = []
    for name, module in model.named_modules():
        if any(True for _ in module.children()):
            continue
        if not isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
            continue
        if _matches(name, patterns) or _matches(type(module).__name__, patterns):
            continue
        if not all(p.requires_grad for p in module.parameters()):
            continue
        reason = unsupported_reason(module)
        if reason is not None:
            warnings.warn(f"K-FAC leaves layer {name!r} unpreconditioned: {reason}",
                          stacklevel=3)
            continue
        cls = LinearLayer if isinstance(module, torch.nn.Linear) else Conv2dLayer
        layers.append(cls(name, module, factor_dtype))
    return layers
