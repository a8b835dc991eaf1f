"""Starting dlcomm on MPI processes: the communicator ``init()`` runs on and where each rank
sits (its host, its rank among the host's ranks). Importing this module initialises MPI."""
from __future__ import annotations

import dataclasses
from typing import Any

from mpi4py import MPI

from dlcomm.comm.mpi_backend import MPICommunicator


@dataclasses.dataclass(frozen=True)
class World:
    """The ranks dlcomm runs on, as the transport sees them."""

    comm: MPICommunicator
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    threads_multiple: bool  # MPI runs with MPI_THREAD_MULTIPLE


def world_communicator() -> MPICommunicator:
    """``MPI.COMM_WORLD`` as a transport communicator."""
    return MPICommunicator(MPI.COMM_WORLD)


def finalized() -> bool:
    """True once MPI was finalised (at interpreter exit): no collective may run after it."""
    return bool(MPI.Is_finalized())


def open_world(comm: Any = None) -> World:
    """The world of ``init(comm=...)``: an mpi4py communicator, a list of world ranks to run
    on, or None for every rank. Collective over those ranks (it splits by host twice)."""
    if comm is None:
        comm = MPI.COMM_WORLD
    elif isinstance(comm, (list, tuple)):
        ranks = list(comm)
        world = MPI.COMM_WORLD
        if not all(isinstance(r, int) and 0 <= r < world.Get_size() for r in ranks):
            raise ValueError(f"comm ranks must be world ranks in [0, {world.Get_size()}), "
                             f"got {ranks}")
        comm = world.Create_group(world.Get_group().Incl(sorted(ranks)))
        if comm == MPI.COMM_NULL:
            raise ValueError(f"this process (world rank {world.Get_rank()}) is not in {ranks}")
    elif not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator or a list of ranks, "
                        f"got {type(comm).__name__}")
    rank = comm.Get_rank()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    cross = comm.Split(color=local.Get_rank(), key=rank)
    world = World(MPICommunicator(comm), local.Get_rank(), local.Get_size(), cross.Get_rank(),
                  cross.Get_size(), MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    local.Free()
    cross.Free()
    return world
