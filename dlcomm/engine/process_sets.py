"""A process set as the engine sees it: its members and, on members, its communicators."""
from __future__ import annotations

from typing import Any

from dlcomm.comm.counting import ByteCounter, CountingCommunicator


class ProcessSetState:
    """Members (world ranks, ascending) and the communicators the operations run on, each
    wrapped to count the payload bytes sent through it; NCCL is set up on first use."""

    def __init__(self, set_id: int, ranks: tuple[int, ...], comm: Any,
                 counter: ByteCounter) -> None:
        self.id = set_id
        self.ranks = ranks
        self.comm = comm  # the transport communicator; None on ranks outside the set
        self.counter = counter
        self._data = None if comm is None else CountingCommunicator(comm, counter)
        self._exchange: Any = None  # compressed exchange's view of comm, made on first use
        self._nccl: Any = None  # NCCL communicator for device arrays, made on first use

    def data_comm(self, device: bool) -> Any:
        """MPI for host arrays; NCCL (created collectively on first use) for device ones."""
        if not device:
            return self._data
        if self._nccl is None:
            # CuPy's NCCL is an optional dependency, loaded for the first device array.
            from dlcomm.comm.nccl_backend import NCCLCommunicator  # noqa: PLC0415

            self._nccl = CountingCommunicator(NCCLCommunicator(self.comm), self.counter)
        return self._nccl

    def exchange_comm(self) -> Any:
        """The communicator unfused compressed exchange runs its rounds on: MPI's own
        collectives, or the set's TCP mesh where its ranks outnumber a machine's cores and
        span several hosts (``exchange_transport``). Collective on first use."""
        if self._exchange is None:
            self._exchange = CountingCommunicator(exchange_transport(self.comm.plain),
                                                  self.counter)
        return self._exchange

    def set_rank(self, world_rank: int) -> int:
        """``world_rank``'s rank within the set."""
        return self.ranks.index(world_rank)

    def free(self) -> None:
        """Release the set's communicator (collective over its members)."""
        if self.comm is not None:
            self.comm.free()


def exchange_transport(plain: Any) -> Any:
    """``plain`` (MPI's own collectives), or its rounds over ``plain``'s TCP mesh where
    ranks outnumber a machine's cores and span several hosts, as the negotiation and
    ``auto`` do there: MPI moves a round's bytes only while the waiting ranks test, and on
    such a machine a small round cost 16 ms instead of 0.2 ms while the ranks computed
    (docs/collectives.md). ``DLCOMM_TCP_MESH=off``, a mesh that cannot connect, one rank or
    an elastic job's communicator: ``plain``. Collective."""
    from dlcomm.comm.tcp_communicator import TcpCommunicator  # noqa: PLC0415 - no MPI

    if plain.size < 2 or isinstance(plain, TcpCommunicator):
        return plain
    # The mesh modules import the MPI transport, which starts MPI: only for MPI jobs.
    from dlcomm.comm.machine import crowded_across_hosts  # noqa: PLC0415
    from dlcomm.comm.mesh_communicator import MeshExchange, mesh_communicator  # noqa: PLC0415

    if not crowded_across_hosts(plain):
        return plain
    mesh = mesh_communicator(plain)
    return plain if mesh is None else MeshExchange(mesh)
