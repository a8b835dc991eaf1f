"""A worker's side of elastic rendezvous: joining a round of ``dlcommrun``'s elastic driver,
all-gathering small values through it (what building a TCP mesh needs before there is one),
and asking it whether the hosts changed.

Every request is one connection to the driver's Unix socket carrying one length-prefixed
pickled message each way. A Unix socket, not TCP: emulated hosts live in network
namespaces without a route to the driver, but they share its file system.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import struct
from typing import Any

from dlcomm.errors import DLCommError, PeerLostError

RENDEZVOUS_ENV = "DLCOMM_ELASTIC_RENDEZVOUS"  # "unix:<path>", set by the elastic driver
WORKER_ENV = "DLCOMM_ELASTIC_WORKER"  # "<worker id>:<host>:<slot>", set by the driver
_LENGTH = struct.Struct("!Q")


class DriverGoneError(DLCommError):
    """The elastic driver cannot be reached or told this worker to stop."""


def send_message(sock: socket.socket, message: Any) -> None:
    """Send one pickled ``message`` preceded by its length."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def recv_message(sock: socket.socket) -> Any:
    """Receive one message sent by ``send_message``; ConnectionError when the peer closed."""
    header = _recv_exactly(sock, _LENGTH.size)
    return pickle.loads(_recv_exactly(sock, _LENGTH.unpack(header)[0]))


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    chunks, got = [], 0
    while got < count:
        chunk = sock.recv(min(count - got, 1 << 20))
        if not chunk:
            raise ConnectionError(f"connection closed with {count - got} bytes still to come")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


@dataclasses.dataclass(frozen=True)
class Assignment:
    """Where this worker sits in a round the driver formed."""

    round_id: int
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    lost_ranks: bool  # the previous round lost a member (state must travel from rank 0)


class RendezvousClient:
    """Requests to the driver at ``address`` (``unix:<path>``) on behalf of one worker."""

    def __init__(self, address: str, worker: str) -> None:
        kind, _, path = address.partition(":")
        if kind != "unix" or not path:
            raise ValueError(f"{RENDEZVOUS_ENV} must be 'unix:<path>', got {address!r}")
        worker_id, host, slot = (worker.split(":") + ["", "", ""])[:3]
        if not worker_id or not host or not slot.isdigit():
            raise ValueError(f"{WORKER_ENV} must be '<id>:<host>:<slot>', got {worker!r}")
        self.path, self.worker_id, self.host, self.slot = path, worker_id, host, int(slot)

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> RendezvousClient | None:
        """The client of the driver that started this process; None outside elastic jobs."""
        environ = os.environ if environ is None else environ
        address = environ.get(RENDEZVOUS_ENV)
        if not address:
            return None
        return cls(address, environ.get(WORKER_ENV, ""))

    def request(self, message: dict) -> Any:
        """Send ``message`` and return the driver's reply (blocks as long as the driver
        holds the request: a join waits for the round to form)."""
        message = {**message, "worker": self.worker_id}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(self.path)
                send_message(sock, message)
                reply = recv_message(sock)
        except OSError as exc:  # ConnectionError is an OSError
            raise DriverGoneError(f"the elastic driver at {self.path} did not answer "
                                  f"{message['op']!r}: {exc}") from exc
        if isinstance(reply, dict) and "stop" in reply:
            raise DriverGoneError(f"the elastic driver stopped worker {self.worker_id}: "
                                  f"{reply['stop']}")
        if isinstance(reply, dict) and "lost" in reply:
            raise PeerLostError(reply["lost"])
        return reply

    def join(self) -> Assignment:
        """Wait for the driver to form the next round with this worker; its place there."""
        return Assignment(**self.request({"op": "join", "host": self.host, "slot": self.slot}))

    def report_unreachable(self, round_id: int, pairs: list[tuple[int, int]]) -> None:
        """Tell the driver which ranks of ``round_id`` could not connect to which."""
        self.request({"op": "unreachable", "round": round_id, "pairs": pairs})

    def hosts_updated(self, round_id: int) -> bool:
        """True when the driver wants a new round (hosts added or lost) after ``round_id``."""
        return bool(self.request({"op": "updates", "round": round_id}))


class RoundBootstrap:
    """The collective calls a ``TcpMesh`` makes while it is built, through the driver."""

    def __init__(self, client: RendezvousClient, assignment: Assignment) -> None:
        self.client, self.assignment = client, assignment
        self.rank, self.size = assignment.rank, assignment.size
        self._sequence = 0

    def allgather(self, value: Any) -> list:
        """Every rank's picklable ``value`` in rank order."""
        self._sequence += 1
        return self.client.request({"op": "gather", "round": self.assignment.round_id,
                                    "sequence": self._sequence, "rank": self.rank,
                                    "value": value})

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        """``root``'s ``obj`` on every rank."""
        return self.allgather(obj if self.rank == root else None)[root]
