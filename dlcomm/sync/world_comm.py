"""The MPI communicator that ``dlcomm.sync`` algorithms build their own communicators from.

DS-Sync and DLCP talk to MPI through mpi4py directly (each for a measured reason stated in
its module); both must run on the same ranks as dlcomm itself.
"""
from __future__ import annotations

from typing import Any


def base_comm(comm: Any, what: str) -> Any:
    """``comm``, or ``MPI.COMM_WORLD`` when dlcomm runs on all of it; refuses the world when
    dlcomm was started on a subset (``init(comm=...)``): then ``comm=`` must be given."""
    from mpi4py import MPI

    from dlcomm import basics

    if comm is not None:
        return comm
    if basics.is_initialized() and basics.size() != MPI.COMM_WORLD.Get_size():
        raise ValueError(f"dlcomm runs on a subset of MPI_COMM_WORLD: pass comm= (the same "
                         f"ranks) to {what}")
    return MPI.COMM_WORLD
