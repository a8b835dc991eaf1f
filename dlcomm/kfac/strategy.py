"""Who preconditions which layer: KAISA's gradient-worker fraction and the grid it implies.

``grad_worker_fraction`` f gives each layer ``f x world`` gradient workers: ranks that hold
the layer's inverses and compute its preconditioned gradient themselves. COMM-OPT (f = 1)
sends every inverse to every rank and no gradients; MEM-OPT (f = 1/world) keeps each
layer's inverses on one rank, which sends the preconditioned gradient to the others;
HYBRID-OPT lies between. The ranks form a ``grad_workers x (world / grad_workers)`` grid:
a column holds the gradient workers of the layers placed on it, a row holds one member of
every column, so a row's all-gather hands every rank every preconditioned gradient.
"""
from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass
from typing import Union


class DistributedStrategy(enum.Enum):
    """Named gradient-worker fractions (kfac-pytorch's names and meanings)."""

    COMM_OPT = "comm-opt"      # fraction 1: inverses to every rank, no gradient exchange
    MEM_OPT = "mem-opt"        # fraction 1/world: one owner per layer sends the gradient
    HYBRID_OPT = "hybrid-opt"  # fraction 1/2


StrategyLike = Union[DistributedStrategy, str, float, int]


@dataclass(frozen=True)
class WorkerGrid:
    """``grad_workers`` rows by ``world_size / grad_workers`` columns of ranks, row-major.

    Column c = {c, c + n, c + 2n, ...} (n columns): the gradient workers of the layers
    placed on it. Row r = {r n, ..., r n + n - 1}: one member of every column.
    """

    world_size: int
    grad_workers: int

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 1 <= self.grad_workers <= self.world_size:
            raise ValueError(f"grad_workers must be in [1, {self.world_size}], got "
                             f"{self.grad_workers}")
        if self.world_size % self.grad_workers:
            raise ValueError(f"{self.grad_workers} gradient workers do not divide "
                             f"{self.world_size} ranks into equal groups")

    @property
    def columns(self) -> int:
        return self.world_size // self.grad_workers

    def column_of(self, rank: int) -> int:
        return rank % self.columns

    def row_of(self, rank: int) -> int:
        return rank // self.columns

    def column_ranks(self, column: int) -> tuple[int, ...]:
        return tuple(range(column, self.world_size, self.columns))

    def row_ranks(self, row: int) -> tuple[int, ...]:
        return tuple(range(row * self.columns, (row + 1) * self.columns))

    @property
    def strategy(self) -> DistributedStrategy:
        if self.grad_workers == self.world_size:
            return DistributedStrategy.COMM_OPT
        if self.grad_workers == 1:
            return DistributedStrategy.MEM_OPT
        return DistributedStrategy.HYBRID_OPT

    @property
    def broadcast_inverses(self) -> bool:
        """Inverses travel from their owner to the other gradient workers of a layer."""
        return self.grad_workers > 1

    @property
    def broadcast_gradients(self) -> bool:
        """Preconditioned gradients travel from a gradient worker to the other ranks."""
        return self.grad_workers < self.world_size


def resolve_grad_workers(grad_worker_fraction: StrategyLike, world_size: int) -> WorkerGrid:
    """The grid for ``grad_worker_fraction`` (a ``DistributedStrategy``, its name such as
    ``"mem-opt"``, or a fraction in [0, 1], 0 meaning 1/world) on ``world_size`` ranks."""
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) \
            or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if isinstance(grad_worker_fraction, str):
        key = grad_worker_fraction.strip().lower().replace("_", "-")
        try:
            grad_worker_fraction = DistributedStrategy(key)
        except ValueError:
            names = ", ".join(s.value for s in DistributedStrategy)
            raise ValueError(f"grad_worker_fraction {grad_worker_fraction!r} is not a "
                             f"strategy ({names}) or a number in [0, 1]") from None
    if isinstance(grad_worker_fraction, DistributedStrategy):
        fraction = {DistributedStrategy.COMM_OPT: 1.0,
                    DistributedStrategy.HYBRID_OPT: 0.5,
                    DistributedStrategy.MEM_OPT: 1.0 / world_size}[grad_worker_fraction]
    elif isinstance(grad_worker_fraction, bool) or not isinstance(grad_worker_fraction,
                                                                  numbers.Real):
        raise TypeError(f"grad_worker_fraction must be a DistributedStrategy, its name or a "
                        f"number, got {type(grad_worker_fraction).__name__}")
    else:
        fraction = float(grad_worker_fraction)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"grad_worker_fraction must be in [0, 1], got {fraction}")
        if fraction == 0.0:
            fraction = 1.0 / world_size
    workers = fraction * world_size
    grad_workers = max(1, round(workers))
    if not math.isclose(workers, grad_workers, rel_tol=1e-9) and workers >= 1:
        raise ValueError(f"grad_worker_fraction {fraction:g} x {world_size} ranks = "
                         f"{workers:g} gradient workers per layer, not a whole number; pick a "
                         "fraction k / world_size with k dividing world_size")
    if world_size % grad_workers:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(f"{grad_workers} gradient workers per layer do not split "
                         f"{world_size} ranks into equal groups; use k / {world_size} with "
                         f"k in {divisors}")
    return WorkerGrid(world_size, grad_workers)
