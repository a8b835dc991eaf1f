"""The MPI communicator that ``dlcomm.heterogeneity`` algorithms build their own communicators from.

DS-Sync and DLCP talk to MPI through mpi4py directly (each for a measured reason stated in
its module); both must run on the same ranks as dlcomm itself.
"""
from __future__ import annotations

from typing import Any


def base_comm(comm: Any = None) -> Any:
    """``comm`` if given, else the communicator dlcomm was started on (``init(comm=...)``,
    so a job that runs dlcomm on a subset of the world needs nothing more), else
    ``MPI.COMM_WORLD`` when dlcomm is not running."""
    from dlcomm import basics

    if comm is not None:
        return comm
    if basics.is_initialized():
        return basics.state().comm
    from mpi4py import MPI

    return MPI.COMM_WORLD
