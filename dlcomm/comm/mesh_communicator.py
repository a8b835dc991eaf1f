"""An ``MPICommunicator`` whose all-to-all, all-gather and blocking point-to-point messages
travel over a ``TcpMesh``, and, as the engine's control communicator, its negotiation too.

Everything else (barriers, broadcasts, non-blocking messages, small values) stays on MPI. The
collective algorithms run on it unchanged: ``ordered`` over this communicator sends the same
blocks and reduces them in the same rank order as over MPI, so it gives the same bits, only
over connections that keep the links busy (``tcp_mesh``).
"""
from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from dlcomm.comm.mpi_backend import MPICommunicator, _displacements
from dlcomm.comm.tcp_communicator import TcpCommunicator
from dlcomm.comm.tcp_mesh import MeshError, TcpMesh, Transfer

TCP_MESH_ENV = "DLCOMM_TCP_MESH"  # "auto" (default): offered to the cost model; "off": never


class MeshCommunicator(MPICommunicator):
    """``base``'s MPI communicator with all-to-all and all-gather over ``mesh``."""

    def __init__(self, base: MPICommunicator, mesh: TcpMesh) -> None:
        super().__init__(base.comm)
        self.mesh = mesh
        # The elastic jobs' communicator over the same mesh: its negotiation methods.
        self._control = TcpCommunicator(mesh)

    def __repr__(self) -> str:
        return f"MeshCommunicator(rank={self.rank}, size={self.size})"

    def alltoallv(self, sendbuf: np.ndarray, sendcounts: list[int], recvbuf: np.ndarray,
                  recvcounts: list[int]) -> None:
        send_at, recv_at = _displacements(sendcounts), _displacements(recvcounts)
        me = self.rank
        recvbuf[recv_at[me]:recv_at[me] + recvcounts[me]] = \
            sendbuf[send_at[me]:send_at[me] + sendcounts[me]]
        others = [p for p in range(self.size) if p != me]
        self.mesh.exchange(
            {p: sendbuf[send_at[p]:send_at[p] + sendcounts[p]] for p in others},
            {p: recvbuf[recv_at[p]:recv_at[p] + recvcounts[p]] for p in others})

    def allgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int]) -> None:
        at, me = _displacements(counts), self.rank
        mine = recvbuf[at[me]:at[me] + counts[me]]
        if mine.size and not np.shares_memory(mine, sendbuf):
            mine[...] = sendbuf
        others = [p for p in range(self.size) if p != me]
        self.mesh.exchange({p: sendbuf for p in others},
                           {p: recvbuf[at[p]:at[p] + counts[p]] for p in others})

    def sendrecv_into(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int,
                      tag: int) -> None:
        """Send to ``dest`` while receiving from ``source`` (messages between two ranks
        arrive in the order sent, so ``tag`` needs no matching)."""
        self.mesh.exchange({dest: sendbuf}, {source: recvbuf})

    def send(self, buf: np.ndarray, dest: int, tag: int) -> None:
        self.mesh.exchange({dest: buf}, {})

    def recv(self, buf: np.ndarray, source: int, tag: int) -> None:
        self.mesh.exchange({}, {source: buf})

    # --- control path (negotiation), when the engine negotiates over the mesh --------------
    def iallreduce_band(self, words: np.ndarray) -> Any:
        """Bitwise-AND all-reduce of ``words`` (uint64), in place, over the mesh; done when
        it returns. The wait sleeps in the kernel's socket reads instead of testing MPI
        between sleeps (docs/collectives.md)."""
        return self._control.iallreduce_band(words)

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's byte string (any length), in rank order, over the mesh."""
        return self._control.allgather_bytes(payload)

    def start_exchange(self, sends: list[tuple[int, np.ndarray]],
                       recvs: list[tuple[int, np.ndarray]]) -> Transfer:
        """``TcpMesh.start``: queue messages now, ``wait()`` later (pipelined algorithms)."""
        return self.mesh.start(sends, recvs)

    def free(self) -> None:
        """Close the mesh; the MPI communicator belongs to ``base``'s owner."""
        self.mesh.close()


def mesh_setting(environ: dict[str, str] | None = None) -> str:
    """``DLCOMM_TCP_MESH``: ``auto`` (default) or ``off``; ValueError for anything else."""
    environ = os.environ if environ is None else environ
    setting = environ.get(TCP_MESH_ENV, "auto").strip().lower() or "auto"
    if setting not in ("auto", "off"):
        raise ValueError(f"{TCP_MESH_ENV} must be 'auto' or 'off', got {setting!r}")
    return setting


def mesh_communicator(comm: MPICommunicator,
                      environ: dict[str, str] | None = None) -> MeshCommunicator | None:
    """``comm`` over a TCP mesh, built collectively on first use and cached on ``comm``;
    None on every rank when ``DLCOMM_TCP_MESH=off``, for one rank, or when any rank could
    not connect (logged once; MPI carries everything then)."""
    if mesh_setting(environ) == "off" or comm.size < 2:
        return None

    def build() -> Any:
        try:
            return MeshCommunicator(comm, TcpMesh(comm, environ))
        except MeshError as exc:
            if comm.rank == 0:
                logging.getLogger("dlcomm").warning("%s; all-reduces stay on MPI", exc)
            return _NoMesh()

    built = comm.cached(("tcp_mesh",), build)
    return None if isinstance(built, _NoMesh) else built


class _NoMesh:
    """Cached when the mesh could not be built, so no rank tries again."""
