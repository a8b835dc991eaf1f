"""All-gather over the TCP mesh: every rank's block sent straight to every other rank.

An all-gather moves bytes without reducing them, so which transport carries it changes only
the time. ``ordered_tcp``'s all-reduce ends with this exchange; the engine's all-gather
(DeAR's second half, ``hvd.allgather``) uses it where the cost model sends an all-reduce of
the same bytes over the mesh (``selection.auto_allgather``).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dlcomm.collectives.buffers import CommLike, check_comm
from dlcomm.comm.mesh_communicator import mesh_communicator


def mesh_allgather(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray,
                   counts: Sequence[int]) -> np.ndarray:
    """Concatenate every rank's ``sendbuf`` (``counts[i]`` elements from rank i) into
    ``recvbuf`` in rank order, over the communicator's TCP mesh (MPI's all-gather where the
    mesh is off or unavailable). Returns ``recvbuf``."""
    comm = check_comm(comm)
    mesh = mesh_communicator(comm)
    (mesh or comm).allgatherv(sendbuf, recvbuf, list(counts))
    return recvbuf
