"""The workload: one worker's iteration as layers, each with a forward time, a backward time
and the gradient tensors its backward pass produces.

Layers are in forward order; the backward pass visits them in reverse and a layer's
gradients are ready when its backward ends (what wait-free backpropagation sends). A
workload comes from a model description and a device speed (``model_zoo``), from a torch
model profiled with hooks (``profile_torch``), from dlcomm's timeline (``timeline_profile``)
or from its JSON (``Workload.load``).
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _check_time(owner: str, name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}.{name} must be a finite number of seconds >= 0, got "
                         f"{value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A gradient tensor: its name, shape and element size in bytes (4: float32)."""

    name: str
    shape: tuple[int, ...]
    itemsize: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Tensor.name must be a non-empty string, got {self.name!r}")
        shape = tuple(self.shape)
        if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                            for d in shape):
            raise ValueError(f"tensor {self.name}: shape must be a non-empty tuple of ints "
                             f">= 1, got {self.shape!r}")
        object.__setattr__(self, "shape", shape)
        if self.itemsize not in (1, 2, 4, 8):
            raise ValueError(f"tensor {self.name}: itemsize must be 1, 2, 4 or 8, got "
                             f"{self.itemsize!r}")

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the dense gradient."""
        return self.numel * self.itemsize

    @property
    def matrix_shape(self) -> tuple[int, int]:
        """Rows and columns of ``reshape(shape[0], -1)`` (how low-rank compressors see it)."""
        return self.shape[0], self.numel // self.shape[0]


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer of the model: forward and backward seconds and its gradient tensors."""

    name: str
    forward_s: float
    backward_s: float
    tensors: tuple[Tensor, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Layer.name must be a non-empty string, got {self.name!r}")
        _check_time(f"layer {self.name}", "forward_s", self.forward_s)
        _check_time(f"layer {self.name}", "backward_s", self.backward_s)
        object.__setattr__(self, "tensors", tuple(self.tensors))


@dataclasses.dataclass(frozen=True)
class Workload:
    """A worker's iteration at ``batch_size`` samples: ``layers`` in forward order and the
    optimizer's ``update_s`` after the gradients are averaged."""

    name: str
    batch_size: int
    layers: tuple[Layer, ...]
    update_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or self.batch_size < 1:
            raise ValueError(f"Workload.batch_size must be an int >= 1, got "
                             f"{self.batch_size!r}")
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise ValueError(f"workload {self.name!r} has no layers")
        _check_time(f"workload {self.name}", "update_s", self.update_s)
        names = [t.name for t in self.tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"workload {self.name!r}: tensor names must be unique")

    @property
    def tensors(self) -> list[Tensor]:
        """Every gradient tensor, in forward order."""
        return [t for layer in self.layers for t in layer.tensors]

    @property
    def parameter_bytes(self) -> int:
        """Bytes of all gradients (the dense message of one iteration)."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def forward_s(self) -> float:
        """The forward pass."""
        return sum(layer.forward_s for layer in self.layers)

    @property
    def backward_s(self) -> float:
        """The backward pass."""
        return sum(layer.backward_s for layer in self.layers)

    @property
    def compute_s(self) -> float:
        """Forward, backward and update: one iteration with no communication at all."""
        return self.forward_s + self.backward_s + self.update_s

    def scaled(self, factor: float, *, update: bool = False) -> Workload:
        """Forward and backward ``factor`` times as long (a slower worker, a bigger batch);
        the update too when ``update``."""
        if not math.isfinite(factor) or factor <= 0:
            raise ValueError(f"scale factor must be > 0, got {factor!r}")
        layers = tuple(dataclasses.replace(layer, forward_s=layer.forward_s * factor,
                                           backward_s=layer.backward_s * factor)
                       for layer in self.layers)
        return dataclasses.replace(self, layers=layers,
                                   update_s=self.update_s * (factor if update else 1.0))

    def with_compute(self, forward_backward_s: float, update_s: float | None = None
                     ) -> Workload:
        """The same layers with forward+backward rescaled to ``forward_backward_s`` in total
        (the per-layer split kept), e.g. to the compute time measured in a training run."""
        _check_time(f"workload {self.name}", "forward_backward_s", forward_backward_s)
        now = self.forward_s + self.backward_s
        if now <= 0:
            raise ValueError(f"workload {self.name!r} has no compute time to rescale")
        out = self.scaled(forward_backward_s / now) if forward_backward_s > 0 else \
            dataclasses.replace(self, layers=tuple(dataclasses.replace(
                layer, forward_s=0.0, backward_s=0.0) for layer in self.layers))
        return out if update_s is None else dataclasses.replace(out, update_s=update_s)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description."""
        return {"name": self.name, "batch_size": self.batch_size, "update_s": self.update_s,
                "layers": [{"name": layer.name, "forward_s": layer.forward_s,
                            "backward_s": layer.backward_s,
                            "tensors": [{"name": t.name, "shape": list(t.shape),
                                         "itemsize": t.itemsize} for t in layer.tensors]}
                           for layer in self.layers]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        """The inverse of ``to_dict``; ValueError naming a missing or bad field."""
        try:
            layers = [Layer(layer["name"], layer["forward_s"], layer["backward_s"],
                            tuple(Tensor(t["name"], tuple(t["shape"]), t.get("itemsize", 4))
                                  for t in layer.get("tensors", ())))
                      for layer in data["layers"]]
            return cls(data["name"], data["batch_size"], tuple(layers),
                       data.get("update_s", 0.0))
        except KeyError as exc:
            raise ValueError(f"workload JSON lacks the field {exc.args[0]!r}") from None

    def save(self, path: str | Path) -> None:
        """Write the JSON description."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Workload:
        """Read a JSON description written by ``save`` (or by hand)."""
        return cls.from_dict(json.loads(Path(path).read_text()))


def layers_from_times(names: Sequence[str], forward_s: Sequence[float],
                      backward_s: Sequence[float], tensors: Sequence[Sequence[Tensor]]
                      ) -> tuple[Layer, ...]:
    """Layers from parallel lists (profilers build them this way)."""
    if not (len(names) == len(forward_s) == len(backward_s) == len(tensors)):
        raise ValueError("names, forward_s, backward_s and tensors must have equal lengths")
    return tuple(Layer(n, f, b, tuple(t))
                 for n, f, b, t in zip(names, forward_s, backward_s, tensors))
