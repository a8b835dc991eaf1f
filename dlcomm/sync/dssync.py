"""DS-Sync (Divide-and-Shuffle Synchronisation): average parameters within small groups that
change every step.

Every step all ranks derive the same partition of the ranks into groups of ``group_size``
from a shared seed and the step number, so no message is needed to agree on it. The process
sets of a cycle of ``cycle`` partitions are registered once (``add_process_set`` is
collective over all ranks) and reused round-robin, so no communicator is split per step.
A group's average touches only its members, which shrinks the scale of every
synchronisation; the shuffle mixes the groups' models over time. ``global_average`` averages
over all ranks (before evaluation, checkpoints and at the end).
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from dlcomm import mpi_ops
from dlcomm.basics import add_process_set, rank, size
from dlcomm.ops import Average
from dlcomm.process_sets import ProcessSet, global_process_set

DEFAULT_CYCLE = 8


def _check_int(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def partition(num_ranks: int, group_size: int, seed: int, index: int) -> list[list[int]]:
    """Partition ranks ``0..num_ranks-1`` into groups of about ``group_size``.

    A pure function of its arguments (every rank computes the same answer): a permutation
    drawn from ``(seed, index)`` cut into ``ceil(num_ranks / group_size)`` groups whose sizes
    differ by at most one. Groups are returned sorted, each with sorted ranks.
    """
    n = _check_int(num_ranks, "num_ranks", 1)
    s = _check_int(group_size, "group_size", 1)
    _check_int(seed, "seed", 0)
    _check_int(index, "index", 0)
    if s >= n:
        return [list(range(n))]
    perm = np.random.default_rng([seed, index]).permutation(n)
    groups = [sorted(int(r) for r in part) for part in np.array_split(perm, -(-n // s))]
    return sorted(groups)


class GroupCycle:
    """The process sets of ``cycle`` partitions, registered once, used round-robin by step.

    Construction is collective: every rank must build it with the same arguments, in the same
    order relative to other ``add_process_set`` calls. With ``group_size >= size()`` every
    step uses the global process set (DS-Sync is then BSP).
    """

    def __init__(self, group_size: int, seed: int = 0, cycle: int = DEFAULT_CYCLE) -> None:
        self.group_size = _check_int(group_size, "group_size", 1)
        self.seed = _check_int(seed, "seed", 0)
        self.cycle = _check_int(cycle, "cycle", 1)
        self.num_ranks = size()
        self.partitions = [partition(self.num_ranks, self.group_size, self.seed, k)
                           for k in range(self.cycle)]
        registered: dict[tuple[int, ...], ProcessSet] = {
            tuple(range(self.num_ranks)): global_process_set}
        for part in self.partitions:  # same order on every rank
            for group in part:
                key = tuple(group)
                if key not in registered:
                    registered[key] = add_process_set(list(group))
        me = rank()
        self._mine = [registered[tuple(next(g for g in part if me in g))]
                      for part in self.partitions]

    def group_ranks(self, step: int) -> list[int]:
        """The ranks of this rank's group at ``step``."""
        return list(self.process_set(step).ranks or [])

    def process_set(self, step: int) -> ProcessSet:
        """This rank's process set at ``step``."""
        return self._mine[_check_int(step, "step", 0) % self.cycle]


def average_in_group(arrays: Sequence[np.ndarray], cycle: GroupCycle, step: int,
                     name: str = "dssync") -> list[np.ndarray]:
    """Average ``arrays`` (same dtype) within this rank's group at ``step``, in place."""
    if not isinstance(cycle, GroupCycle):
        raise TypeError(f"cycle must be a GroupCycle, got {type(cycle).__name__}")
    ps = cycle.process_set(step)
    if ps.size() == 1:
        return list(arrays)
    return mpi_ops.grouped_allreduce_async(
        # Names are matched across all ranks: the group's set id keeps groups apart.
        list(arrays), name=f"{name}.set{ps.process_set_id}", op=Average, process_set=ps,
        outputs=list(arrays)).wait()


def global_average(arrays: Sequence[np.ndarray], name: str = "dssync.global"
                   ) -> list[np.ndarray]:
    """Average ``arrays`` over every rank, in place (before evaluation or a checkpoint)."""
    return mpi_ops.grouped_allreduce_async(list(arrays), name=name, op=Average,
                                           outputs=list(arrays)).wait()
