"""The process sets K-FAC's exchanges run on: this rank's column and row of the grid.

A column all-gathers inverses, a row all-gathers preconditioned gradients. A group of every
rank is the global set, a group of one rank needs no collective (``None``); others are
registered with ``dlcomm.add_process_set``, which every rank calls for every group in the
same order (the engine requires it), so all ranks build all groups.
"""
from __future__ import annotations

from dataclasses import dataclass

from dlcomm import basics
from dlcomm.kfac.strategy import WorkerGrid
from dlcomm.process_sets import ProcessSet, global_process_set


@dataclass
class GridSets:
    """This rank's column and row sets (``None``: a group of one, nothing to exchange)."""

    column: ProcessSet | None
    row: ProcessSet | None
    registered: list[ProcessSet]

    def remove(self) -> None:
        """Unregister the sets this object added (collective, like adding them)."""
        for process_set in self.registered:
            basics.remove_process_set(process_set)
        self.registered.clear()


def grid_process_sets(grid: WorkerGrid, rank: int) -> GridSets:
    """Register the grid's columns and rows that are neither the world nor one rank."""
    if not 0 <= rank < grid.world_size:
        raise ValueError(f"rank {rank} is outside the grid of {grid.world_size} ranks")
    if basics.size() != grid.world_size:
        raise ValueError(f"the grid spans {grid.world_size} ranks but dlcomm runs "
                         f"{basics.size()}")
    registered: list[ProcessSet] = []

    def build(groups: list[tuple[int, ...]], mine: int) -> ProcessSet | None:
        if len(groups[0]) == 1:
            return None
        if len(groups[0]) == grid.world_size:
            return global_process_set
        chosen = None
        for index, ranks in enumerate(groups):  # every rank registers every group, in order
            process_set = basics.add_process_set(list(ranks))
            registered.append(process_set)
            if index == mine:
                chosen = process_set
        return chosen

    column = build([grid.column_ranks(c) for c in range(grid.columns)], grid.column_of(rank))
    row = build([grid.row_ranks(r) for r in range(grid.grad_workers)], grid.row_of(rank))
    return GridSets(column, row, registered)
