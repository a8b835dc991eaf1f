"""DS-Sync (Divide-and-Shuffle Synchronisation): average parameters within small groups that
change every step.

Every step all ranks derive the same partition of the ranks into groups of ``group_size``
from a shared seed and the step number, so no message is needed to agree on it. The
communicators of a cycle of ``cycle`` partitions are split once (collective over all ranks)
and reused round-robin, so no communicator is split per step. A group's average touches only
its members, which shrinks the scale of every synchronisation; the shuffle mixes the groups'
models over time. ``global_average`` averages over all ranks (before evaluation, checkpoints
and at the end).

Why group averages bypass dlcomm's engine: the engine negotiates every request with a
coordinator over *all* ranks each cycle, so a group could start only when every rank's
engine had joined that cycle, which couples all groups every step and undoes what DS-Sync
is for. The partition is known everywhere, so nothing needs negotiating: each group meets in
a polled non-blocking all-gather of its members' layouts and runs one polled non-blocking
all-reduce on its own communicator (the transport's, ``dlcomm.comm``) from the calling
thread (dlcomm initialises MPI with ``MPI_THREAD_MULTIPLE``). Both are polled so that a
member told to stop (another rank read the model alone, ``GlobalSyncPoints``) never leaves
its partners blocked in MPI. Measured at 8 emulated hosts x 1 Gbit/s in
docs/heterogeneity.md.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlcomm import mpi_ops
from dlcomm.comm.polling import wait_polling
from dlcomm.errors import MismatchError
from dlcomm.heterogeneity.agreement import check_same_settings, settings_mismatch
from dlcomm.heterogeneity.world_comm import base_comm
from dlcomm.ops import Average, ReduceOp

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
    """The communicators of ``cycle`` partitions, split once, used round-robin by step.

    Construction is collective: every rank must build it with the same arguments (and in the
    same order relative to other collective calls on ``comm``). ``comm`` defaults to the
    world dlcomm runs on.
    """

    def __init__(self, group_size: int, seed: int = 0, cycle: int = DEFAULT_CYCLE,
                 comm: Any = None) -> None:
        self.group_size = _check_int(group_size, "group_size", 1)
        self.seed = _check_int(seed, "seed", 0)
        self.cycle = _check_int(cycle, "cycle", 1)
        base = base_comm(comm)
        check_same_settings(base, "DS-Sync's GroupCycle", {
            "group_size": self.group_size, "seed": self.seed, "cycle": self.cycle})
        self.num_ranks, me = base.size, base.rank
        self.partitions = [partition(self.num_ranks, self.group_size, self.seed, k)
                           for k in range(self.cycle)]
        split: dict[tuple[tuple[int, ...], ...], Any] = {}
        self._comms = []
        self._groups = []
        for part in self.partitions:  # same order on every rank: the splits match
            key = tuple(tuple(g) for g in part)
            if key not in split:
                color = next(i for i, g in enumerate(part) if me in g)
                split[key] = base.split(color, me)
            self._comms.append(split[key])
            self._groups.append(next(g for g in part if me in g))

    def group_ranks(self, step: int) -> list[int]:
        """The ranks of this rank's group at ``step``."""
        return list(self._groups[_check_int(step, "step", 0) % self.cycle])

    def comm(self, step: int) -> Any:
        """This rank's group communicator (the transport's) at ``step``."""
        return self._comms[_check_int(step, "step", 0) % self.cycle]

    def layout_mismatch(self, step: int, layouts: np.ndarray) -> str | None:
        """The error text when the members of this rank's group at ``step`` average
        different layouts (``layouts``: one (element count, index in ``_AVERAGED_DTYPES``) row
        per member, in member order), or None when they agree."""
        per_member = [{"elements": int(count), "dtype": _AVERAGED_DTYPES[int(code)]}
                      for count, code in layouts]
        ranks = self.group_ranks(step)
        return settings_mismatch(f"The model averaged in DS-Sync group {ranks}", ranks,
                                 per_member)


_AVERAGED_DTYPES = ("float16", "float32", "float64")  # what average_in_group averages


def average_in_group(arrays: Sequence[np.ndarray], cycle: GroupCycle, step: int,
                     while_waiting: Callable[[], None] | None = None) -> list[np.ndarray]:
    """Average ``arrays`` (numpy, one dtype) within this rank's group at ``step``, in place.

    The arrays are packed into one buffer and summed with one all-reduce on the group's
    communicator (float16 is summed in float32). ``while_waiting`` is called while the
    members gather; it may raise to stop waiting for a member that will not come
    (``GlobalSyncPoints.check``).
    """
    if not isinstance(cycle, GroupCycle):
        raise TypeError(f"cycle must be a GroupCycle, got {type(cycle).__name__}")
    arrays = list(arrays)
    if not arrays:
        return arrays
    for a in arrays:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"average_in_group takes numpy arrays, got {type(a).__name__}")
    dtype = arrays[0].dtype
    if dtype.name not in _AVERAGED_DTYPES:
        raise TypeError(f"average_in_group averages float16/32/64 arrays, got {dtype}")
    for a in arrays:
        if a.dtype != dtype:
            raise ValueError(f"average_in_group takes one dtype per call, got {dtype} and "
                             f"{a.dtype}")
    comm = cycle.comm(step)
    members = comm.size
    if members == 1:
        return arrays
    count = sum(a.size for a in arrays)
    work = np.float32 if dtype == np.float16 else dtype
    buf = np.empty(count, dtype=work)
    pos = 0
    for a in arrays:
        buf[pos:pos + a.size] = a.reshape(-1)
        pos += a.size
    # Members meet in a polled all-gather of their layouts (a barrier that also checks the
    # layouts), so a rank whose partner is still computing sleeps instead of spinning in MPI.
    # The sum is polled too: a member may stop waiting (``while_waiting`` raised) after
    # it joined the meeting, and a blocking sum would leave the others waiting for it forever.
    wait = wait_polling if while_waiting is None else _polling_with(while_waiting)
    mine = np.array([count, _AVERAGED_DTYPES.index(dtype.name)], dtype=np.int64)
    layouts = np.empty((members, 2), dtype=np.int64)
    wait(comm.iallgather(mine, layouts.reshape(-1)).test)
    mismatch = cycle.layout_mismatch(step, layouts)
    if mismatch:
        raise MismatchError(mismatch)
    wait(comm.iallreduce(buf, buf, ReduceOp.SUM).test)
    buf /= members
    pos = 0
    for a in arrays:
        a[...] = buf[pos:pos + a.size].reshape(a.shape)
        pos += a.size
    return arrays


def _polling_with(while_waiting: Callable[[], None]) -> Callable[[Callable[[], bool]], None]:
    """``wait_polling`` that also calls ``while_waiting`` (which may raise) between tests."""
    def wait(test: Callable[[], bool]) -> None:
        def done() -> bool:
            while_waiting()
            return test()

        wait_polling(done)
    return wait


def global_average(arrays: Sequence[np.ndarray], name: str = "dssync.global"
                   ) -> list[np.ndarray]:
    """Average ``arrays`` over every rank, in place (before evaluation or a checkpoint)."""
    return mpi_ops.grouped_allreduce_async(list(arrays), name=name, op=Average,
                                           outputs=list(arrays)).wait()
