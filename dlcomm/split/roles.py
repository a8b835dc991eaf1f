"""Who is the cloud and who the edges of a split job, and their agreement on the settings.

One rank runs the cloud part (``split_cloud_rank``, default 0); every other rank is an edge
with its own data, running its own copy of the edge part. Every rank derives the same roles
from the job's size, and the settings that shape the protocol (codecs, micro-batches, where
the labels are, the link policy) are compared across ranks once, so that a rank started with
other settings fails with an error on every rank instead of a hang or garbage.
"""
from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

from dlcomm.errors import MismatchError


@dataclasses.dataclass(frozen=True)
class Roles:
    """The cloud rank and the edge ranks of a job, seen from ``rank``."""

    cloud: int
    edges: tuple[int, ...]
    rank: int

    @property
    def is_cloud(self) -> bool:
        return self.rank == self.cloud

    @property
    def is_edge(self) -> bool:
        return self.rank != self.cloud

    @property
    def edge_index(self) -> int:
        """This edge's position among the edges (-1 on the cloud)."""
        return self.edges.index(self.rank) if self.is_edge else -1


def make_roles(size: int, rank: int, cloud_rank: Any) -> Roles:
    """The roles of a job of ``size`` ranks with the cloud on ``cloud_rank``."""
    if size < 2:
        raise ValueError(f"split fine-tuning needs at least 2 ranks (one cloud, one or more "
                         f"edges), this job has {size}: run it with dlcommrun -np 2 or more")
    if isinstance(cloud_rank, bool) or not isinstance(cloud_rank, numbers.Integral) or \
            not 0 <= cloud_rank < size:
        raise ValueError(f"split_cloud_rank must be a rank in [0, {size}), got {cloud_rank!r}")
    cloud = int(cloud_rank)
    return Roles(cloud, tuple(r for r in range(size) if r != cloud), int(rank))


def differing(per_rank: list[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The settings whose values differ between ranks: name -> value per rank."""
    names = sorted({k for settings in per_rank for k in settings})
    return {name: [s.get(name) for s in per_rank] for name in names
            if any(s.get(name) != per_rank[0].get(name) for s in per_rank[1:])}


def check_agreement(per_rank: list[Mapping[str, Any]], what: str) -> None:
    """Raise ``MismatchError`` (on every rank that calls it with the same gathered list)
    unless every rank passed the same settings."""
    differ = differing(per_rank)
    if differ:
        lines = "; ".join(f"{name}: " + ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(vals))
                          for name, vals in differ.items())
        raise MismatchError(f"{what} was built with different settings on different ranks "
                            f"({lines}); every rank must pass the same")
