"""The communicator that the heterogeneity algorithms build their own communicators from.

DS-Sync and DLCP exchange messages on communicators of their own (each for a measured reason
stated in its module), through the transport (``dlcomm.comm``); both must run on the same
ranks as dlcomm itself.
"""
from __future__ import annotations

from typing import Any

from dlcomm import basics


def base_comm(comm: Any = None) -> Any:
    """The transport communicator of ``comm`` (a transport or mpi4py communicator) if given,
    else the one dlcomm was started on (``init(comm=...)``, so a job that runs dlcomm on a
    subset of the world needs nothing more), else ``MPI.COMM_WORLD`` when dlcomm is not
    running."""
    if comm is None and basics.is_initialized():
        return basics.state().comm
    # The transport imports mpi4py.MPI, which starts MPI: only once a communicator is needed.
    from dlcomm.comm.mpi_backend import as_communicator  # noqa: PLC0415 - MPI start-up
    from dlcomm.comm.world import world_communicator  # noqa: PLC0415 - MPI start-up

    return world_communicator() if comm is None else as_communicator(comm)
