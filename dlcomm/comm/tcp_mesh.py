"""A full mesh of TCP connections among a communicator's ranks: a data plane for large
all-to-all and all-gather exchanges.

Open MPI's TCP transport moves data only while a rank is inside an MPI call and polls for
progress; with more ranks than cores (4 ranks on 2 here) the ranks take turns on the CPU and
the links sit idle between turns. Here every peer has a sending and a receiving thread that
block in the kernel (``sendall``/``recv_into`` release the GIL), so a link is kept busy as
long as data is queued, the way gloo drives its sockets. The connections are made once, over
the addresses every rank publishes through MPI, and each carries a shared random token so a
stray connection is refused.
"""
from __future__ import annotations

import fcntl
import functools
import ipaddress
import os
import queue
import secrets
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlcomm.config import knob_value, parse_bytes
from dlcomm.errors import DLCommError

CONNECT_TIMEOUT_S = 5.0  # per address tried
ACCEPT_TIMEOUT_S = 60.0  # for every lower rank to connect
DIRECT_MESSAGE_BYTES = 64 << 10  # messages up to this size skip the workers on an idle mesh
_SIOCGIFADDR = 0x8915
# Open MPI's own choice of interfaces, when the launcher or user set one (e.g. --emulate).
INCLUDE_ENV = "OMPI_MCA_btl_tcp_if_include"
SEND_BUFFER_ENV = "DLCOMM_TCP_MESH_SEND_BUFFER"


class MeshError(DLCommError):
    """A TCP connection of the mesh failed or a peer closed it. ``failed_pairs``: the
    (rank, peer) pairs that could not connect while the mesh was built (who is cut off)."""

    def __init__(self, message: str, failed_pairs: Sequence[tuple[int, int]] = ()) -> None:
        super().__init__(message)
        self.failed_pairs = list(failed_pairs)


def local_addresses(environ: dict[str, str] | None = None) -> list[str]:
    """This host's IPv4 addresses other than loopback, restricted to the subnets of
    ``OMPI_MCA_btl_tcp_if_include`` when it lists any (the interfaces MPI itself uses)."""
    environ = os.environ if environ is None else environ
    found = []
    for _index, name in socket.if_nameindex():
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", name[:15].encode()))
            found.append(socket.inet_ntoa(packed[20:24]))
        except OSError:  # no IPv4 address on that interface
            pass
        finally:
            probe.close()
    found = [a for a in found if not ipaddress.ip_address(a).is_loopback]
    subnets = []
    for item in environ.get(INCLUDE_ENV, "").split(","):
        try:
            subnets.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:  # an interface name, not a subnet: keep every address
            continue
    if subnets:
        found = [a for a in found if any(ipaddress.ip_address(a) in s for s in subnets)]
    return found


class _Worker:
    """A daemon thread running the jobs queued for one direction of one connection;
    ``pending`` counts the mesh's queued and running jobs (``TcpMesh.start`` reads it)."""

    def __init__(self, name: str, pending: _Pending) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = pending
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], done: _Countdown) -> None:
        self._jobs.put((job, done))

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, done = item
            error = None
            try:
                job()
            except BaseException as exc:  # reported to the caller of exchange()
                error = exc
            self._pending.add(-1)  # before the caller can see the transfer done
            if error is None:
                done.finish()
            else:
                done.fail(error)


class _Pending:
    """Jobs queued or running on any worker of one mesh, under the lock ``start`` holds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0

    def add(self, n: int) -> None:
        with self.lock:
            self.count += n


class _Countdown:
    """Completion of one exchange's jobs; the first error wins."""

    def __init__(self, count: int) -> None:
        self._left = count
        self._cond = threading.Condition()
        self.error: BaseException | None = None

    def finish(self) -> None:
        with self._cond:
            self._left -= 1
            if self._left == 0:
                self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:  # a Condition's lock is re-entrant: finish() may take it again
            self.error = self.error or exc
            self.finish()

    def wait(self) -> None:
        with self._cond:
            while self._left:
                self._cond.wait()


class Transfer:
    """Messages queued by ``TcpMesh.start``; ``wait()`` returns once all completed, or
    raises the first failure as ``MeshError``."""

    def __init__(self, done: _Countdown, rank: int) -> None:
        self._done, self._rank = done, rank

    def wait(self) -> None:
        self._done.wait()
        error = self._done.error
        if error is not None:
            if isinstance(error, MeshError):
                raise error
            raise MeshError(f"TCP mesh exchange on rank {self._rank} failed: {error!r}")


def _recv_exactly(conn: socket.socket, view: memoryview, peer: int) -> None:
    got, total = 0, len(view)
    while got < total:
        cause: OSError | None = None
        try:
            n = conn.recv_into(view[got:], total - got)
        except OSError as exc:
            n, cause = 0, exc
        if n == 0:
            raise MeshError(f"rank {peer} closed its TCP connection with {total - got} of "
                            f"{total} bytes still to come ({f'{cause}; ' if cause else ''}"
                            "did it fail or exit?)") from cause
        got += n


def _send_all(conn: socket.socket, view: memoryview, peer: int) -> None:
    try:
        conn.sendall(view)
    except OSError as exc:
        raise MeshError(f"rank {peer} closed its TCP connection while {len(view)} bytes were "
                        f"being sent to it ({exc}; did it fail or exit?)") from exc


def _detect_dead_peer(conn: socket.socket, seconds: float) -> None:
    """Fail ``conn``'s blocked calls once the peer stays silent for about ``seconds``: probe
    an idle connection every second (keepalive), and give up on unacknowledged data after
    ``seconds`` (TCP_USER_TIMEOUT). A live peer busy computing still answers the probes."""
    probes = max(int(seconds) - 1, 1)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(seconds * 1000))


def send_buffer_bytes(send_buffer: int | str | None = None,
                      environ: dict[str, str] | None = None) -> int:
    """The mesh connections' SO_SNDBUF: ``send_buffer``, else ``DLCOMM_TCP_MESH_SEND_BUFFER``
    in ``environ`` (default ``os.environ``), else 128 KiB; 0 leaves the kernel's autotuning.
    ValueError for anything but a byte count >= 0."""
    environ = os.environ if environ is None else environ
    source = "send_buffer="
    if send_buffer is None:
        send_buffer, source = environ.get(SEND_BUFFER_ENV), SEND_BUFFER_ENV
        if send_buffer is None:
            return knob_value("tcp_mesh_send_buffer")
    if isinstance(send_buffer, bool) or not isinstance(send_buffer, (int, str)):
        raise ValueError(f"{source} must be a byte count >= 0, got {send_buffer!r}")
    try:
        value = parse_bytes(str(send_buffer))
    except ValueError:
        raise ValueError(f"{source} must be a byte count >= 0 such as 131072 or 128k, "
                         f"got {send_buffer!r}") from None
    return value


def _bytes_view(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8))


class TcpMesh:
    """Connections to every other rank of ``comm`` (an ``MPICommunicator``); built
    collectively. ``exchange`` sends and receives arrays with any set of peers at once."""

    def __init__(self, comm: Any, environ: dict[str, str] | None = None,
                 dead_peer_s: float | None = None,
                 accept_timeout_s: float = ACCEPT_TIMEOUT_S,
                 send_buffer: int | None = None) -> None:
        """``comm`` needs only ``rank``, ``size``, ``bcast_object`` and ``allgather`` (an
        ``MPICommunicator``, or the elastic driver's ``RoundBootstrap``). ``dead_peer_s``:
        declare a silent peer dead after about that many seconds (TCP keepalive and user
        timeout), so a cut link fails a blocked exchange instead of hanging it.
        ``accept_timeout_s``: how long to wait for the lower ranks to connect.
        ``send_buffer``: SO_SNDBUF of every connection in bytes (0: the kernel's
        autotuning); ``DLCOMM_TCP_MESH_SEND_BUFFER`` when None."""
        self.rank, self.size = comm.rank, comm.size
        # A bad value on any rank is refused on every rank (none waits for the others).
        try:
            send_buffer = send_buffer_bytes(send_buffer, environ)
            bad = ""
        except ValueError as exc:
            bad = f"rank {self.rank}: {exc}"
        bad = next((b for b in comm.allgather(bad) if b), "")
        if bad:
            raise ValueError(bad)
        self._accept_timeout_s = accept_timeout_s
        self._unreachable: set[int] = set()
        self._conns: dict[int, socket.socket] = {}
        self._senders: dict[int, _Worker] = {}
        self._receivers: dict[int, _Worker] = {}
        self._pending = _Pending()
        # Every rank makes the same collective calls whatever fails locally (a rank that
        # skipped one would leave the others waiting): a local failure travels in them.
        listener, addresses, port, error = None, [], 0, ""
        try:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("", 0))
            listener.listen(max(self.size, 1))
            listener.settimeout(accept_timeout_s)
            port = listener.getsockname()[1]
            addresses = local_addresses(environ)
            if not addresses:
                error = f"rank {self.rank} has no IPv4 address other than loopback"
        except OSError as exc:
            error = f"rank {self.rank} could not listen: {exc}"
        token = comm.bcast_object(secrets.token_bytes(16) if self.rank == 0 else None)
        published = comm.allgather((addresses, port, error))
        error = next((e for _a, _p, e in published if e), "")
        if not error:
            error = self._connect_all(listener, published, token)
        if listener is not None:
            listener.close()
        reports = comm.allgather((error, sorted(self._unreachable)))
        errors = [e for e, _ in reports if e]
        if errors:  # every rank learns that the mesh is unusable, and why
            self.close()
            pairs = [(r, p) for r, (_, peers) in enumerate(reports) for p in peers]
            raise MeshError(f"the TCP mesh could not be built: {errors[0]}", pairs)
        for peer, conn in self._conns.items():
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if send_buffer:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
            if dead_peer_s is not None:
                _detect_dead_peer(conn, dead_peer_s)
            self._senders[peer] = _Worker(f"dlcomm-mesh-send-{peer}", self._pending)
            self._receivers[peer] = _Worker(f"dlcomm-mesh-recv-{peer}", self._pending)

    def _connect_all(self, listener: socket.socket, published: list, token: bytes) -> str:
        """Connect to every higher rank while accepting every lower one; '' or the error."""
        accepted: list[BaseException] = []
        acceptor = threading.Thread(target=self._accept_lower,
                                    args=(listener, token, accepted), daemon=True)
        acceptor.start()
        error = ""
        for peer in range(self.rank + 1, self.size):  # try all: the errors say who is cut off
            addresses, port, _ = published[peer]
            try:
                self._conns[peer] = self._connect(peer, addresses, port, token)
            except (MeshError, OSError) as exc:
                error = error or str(exc)
                self._unreachable.add(peer)
        acceptor.join(self._accept_timeout_s + 1)
        self._unreachable.update(p for p in range(self.rank) if p not in self._conns)
        if accepted and not error:
            error = str(accepted[0])
        return error

    def _connect(self, peer: int, addresses: Sequence[str], port: int,
                 token: bytes) -> socket.socket:
        reasons = []
        for address in addresses:
            try:
                conn = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S)
            except OSError as exc:
                reasons.append(f"{address}:{port}: {exc}")
                continue
            conn.sendall(token + struct.pack("!i", self.rank))
            return conn
        raise MeshError(f"rank {self.rank} could not connect to rank {peer} at any of "
                        f"{list(addresses)} ({'; '.join(reasons) or 'no address published'})")

    def _accept_lower(self, listener: socket.socket, token: bytes,
                      errors: list[BaseException]) -> None:
        try:
            while len([p for p in self._conns if p < self.rank]) < self.rank:
                conn, _addr = listener.accept()
                conn.settimeout(CONNECT_TIMEOUT_S)
                hello = conn.recv(len(token) + 4, socket.MSG_WAITALL)
                peer = struct.unpack("!i", hello[-4:])[0] if len(hello) == len(token) + 4 else -1
                if hello[:len(token)] != token or not 0 <= peer < self.rank:
                    conn.close()  # not one of ours
                    continue
                self._conns[peer] = conn
        except OSError as exc:
            errors.append(MeshError(f"rank {self.rank} waited for its lower ranks to "
                                    f"connect: {exc}"))

    def exchange(self, sends: dict[int, np.ndarray], recvs: dict[int, np.ndarray]) -> None:
        """Send ``sends[peer]`` to each peer while receiving exactly ``recvs[peer].nbytes``
        bytes from each peer into it; returns when all are done. Every message must be
        matched by the peer's call with the same sizes.

        Small messages (each at most ``DIRECT_MESSAGE_BYTES``) on an idle mesh are sent and
        received by the calling thread itself: handing them to the workers costs more than
        moving them (a negotiation-sized all-gather took 1-2 ms that way against MPI's 0.3
        ms on the emulated cluster). They fit the kernel's socket buffers, so sending
        before receiving cannot deadlock, and nothing queued earlier can be overtaken. Only
        here, where the caller waits anyway: ``start`` promises not to block."""
        send_list = [(p, a) for p, a in sends.items() if a.nbytes]
        recv_list = [(p, a) for p, a in recvs.items() if a.nbytes]
        if all(a.nbytes <= DIRECT_MESSAGE_BYTES for _, a in (*send_list, *recv_list)):
            with self._pending.lock:
                if self._pending.count == 0:
                    self._direct(send_list, recv_list).wait()
                    return
        self.start(send_list, recv_list).wait()

    def start(self, sends: Sequence[tuple[int, np.ndarray]],
              recvs: Sequence[tuple[int, np.ndarray]]) -> Transfer:
        """Queue ``(peer, array)`` sends and receives without waiting: each connection
        carries its messages in the order queued (across calls too), so a caller may queue
        the next messages before these completed. ``wait()`` the returned transfer before
        touching its arrays."""
        sends = [(p, a) for p, a in sends if a.nbytes]
        recvs = [(p, a) for p, a in recvs if a.nbytes]
        self._pending.add(len(sends) + len(recvs))
        jobs = [(self._senders[p], functools.partial(_send_all, self._conns[p],
                                                     _bytes_view(a), p))
                for p, a in sends]
        jobs += [(self._receivers[p], functools.partial(_recv_exactly, self._conns[p],
                                                        _bytes_view(a), p))
                 for p, a in recvs]
        done = _Countdown(len(jobs))
        for worker, job in jobs:
            worker.submit(job, done)
        return Transfer(done, self.rank)

    def _direct(self, sends: Sequence[tuple[int, np.ndarray]],
                recvs: Sequence[tuple[int, np.ndarray]]) -> Transfer:
        """``exchange`` done in this thread: every send, then every receive; a failure is
        raised by the transfer's ``wait()``, as from the workers."""
        done = _Countdown(0)
        try:
            for p, a in sends:
                _send_all(self._conns[p], _bytes_view(a), p)
            for p, a in recvs:
                _recv_exactly(self._conns[p], _bytes_view(a), p)
        except BaseException as exc:
            done.error = exc
        return Transfer(done, self.rank)

    def close(self) -> None:
        """Stop the workers and close every connection (idempotent)."""
        for worker in [*self._senders.values(), *self._receivers.values()]:
            worker.stop()
        self._senders.clear()
        self._receivers.clear()
        for conn in self._conns.values():
            try:
                conn.close()
            except OSError:
                pass
        self._conns.clear()

