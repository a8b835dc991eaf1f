"""Starting dlcomm on MPI processes: the communicator ``init()`` runs on and where each rank
sits (its host, its rank among the host's ranks). Importing this module initialises MPI.

A process started by ``dlcommrun``'s elastic driver (not by mpirun: MPI cannot lose a rank
and go on) is a one-rank MPI job; its world is the round the driver forms, over a TCP mesh.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from mpi4py import MPI

from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.comm.rendezvous import Assignment, RendezvousClient, RoundBootstrap
from dlcomm.comm.tcp_communicator import TcpCommunicator
from dlcomm.comm.tcp_mesh import CONNECT_TIMEOUT_S, MeshError, TcpMesh
from dlcomm.errors import PeerLostError


@dataclasses.dataclass(frozen=True)
class World:
    """The ranks dlcomm runs on, as the transport sees them."""

    comm: MPICommunicator | TcpCommunicator
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    threads_multiple: bool  # MPI runs with MPI_THREAD_MULTIPLE
    elastic: Elastic | None = None  # set in a job of the elastic driver


@dataclasses.dataclass(frozen=True)
class Elastic:
    """This process's link to the elastic driver and the round it runs in."""

    client: RendezvousClient
    assignment: Assignment


def world_communicator() -> MPICommunicator:
    """``MPI.COMM_WORLD`` as a transport communicator."""
    return MPICommunicator(MPI.COMM_WORLD)


def finalized() -> bool:
    """True once MPI was finalised (at interpreter exit): no collective may run after it."""
    return bool(MPI.Is_finalized())


def open_world(comm: Any = None, dead_peer_s: float = 10.0) -> World:
    """The world of ``init(comm=...)``: an mpi4py communicator, a list of world ranks to run
    on, or None for every rank (in an elastic job: the driver's next round, whose silent
    peers count as lost after ``dead_peer_s``). Collective over those ranks."""
    client = RendezvousClient.from_environment()
    if client is not None:
        if comm is not None:
            raise ValueError("init(comm=...) cannot be used in an elastic job: the elastic "
                             "driver decides which workers form the world")
        return open_elastic_world(client, dead_peer_s)
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


def open_elastic_world(client: RendezvousClient, dead_peer_s: float) -> World:
    """Join the driver's next round and connect its ranks by TCP."""
    assignment = client.join()
    try:
        mesh = TcpMesh(RoundBootstrap(client, assignment), dead_peer_s=dead_peer_s,
                       accept_timeout_s=2 * CONNECT_TIMEOUT_S)
    except MeshError as exc:  # a member died or cannot be reached while the round formed
        if exc.failed_pairs:  # the driver stops whoever is cut off from the others
            client.report_unreachable(assignment.round_id, exc.failed_pairs)
        raise PeerLostError(str(exc)) from exc
    return World(TcpCommunicator(mesh), assignment.local_rank, assignment.local_size,
                 assignment.cross_rank, assignment.cross_size, threads_multiple=True,
                 elastic=Elastic(client, assignment))
