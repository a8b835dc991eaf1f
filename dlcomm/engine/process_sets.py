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
        """The communicator unfused compressed exchange runs its rounds on (MPI's own
        all-reduce, as those rounds have always used)."""
        if self._exchange is None:
            self._exchange = CountingCommunicator(self.comm.plain, self.counter)
        return self._exchange

    def set_rank(self, world_rank: int) -> int:
        """``world_rank``'s rank within the set."""
        return self.ranks.index(world_rank)

    def free(self) -> None:
        """Release the set's communicator (collective over its members)."""
        if self.comm is not None:
            self.comm.free()
