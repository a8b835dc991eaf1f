"""Process sets (Horovod's ``ProcessSet``): any subset of ranks, usable by every collective.

The global set (all ranks) exists from ``init()``. Others are added with
``add_process_set(ranks)``, which every rank must call, in the same order.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlcomm import runtime


class ProcessSet:
    """A set of world ranks that run collectives among themselves."""

    def __init__(self, ranks: Sequence[int] | None = None) -> None:
        if ranks is not None:
            if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
                raise TypeError(f"ranks must be a sequence of ints, got {type(ranks).__name__}")
            ranks = list(ranks)
            if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
                raise TypeError(f"ranks must be ints, got {ranks!r}")
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"ranks of a process set must be distinct, got {ranks}")
            ranks = sorted(ranks)
        self.ranks: list[int] | None = ranks
        self.process_set_id: int | None = None

    def _require_registered(self) -> None:
        if self.process_set_id is None or self.ranks is None:
            raise ValueError(
                f"{self!r} is not registered: call dlcomm.add_process_set() on every rank first"
            )

    def size(self) -> int:
        """Number of ranks in the set."""
        self._require_registered()
        return len(self.ranks)  # type: ignore[arg-type]

    def rank(self) -> int:
        """This process's rank within the set, or -1 if it is not a member."""
        self._require_registered()
        me = runtime.state().rank
        return self.ranks.index(me) if me in self.ranks else -1  # type: ignore[union-attr]

    def rank_of(self, world_rank: int) -> int:
        """The rank within this set of world rank ``world_rank``, or -1 if not a member."""
        self._require_registered()
        ranks = self.ranks  # type: list[int]  # type: ignore[assignment]
        return ranks.index(world_rank) if world_rank in ranks else -1

    def included(self) -> bool:
        """True when this process is a member."""
        return self.rank() >= 0

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ProcessSet) and (self.process_set_id, self.ranks) == (
            other.process_set_id, other.ranks)

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks or ())))


# The set of all ranks; its ranks are filled in by init().
global_process_set = ProcessSet()
global_process_set.process_set_id = 0
