"""A transport communicator that needs no MPI: every message travels over a ``TcpMesh``.

Elastic jobs start their processes without ``mpirun`` and must outlive a rank that dies. MPI
can do neither (a lost rank aborts the whole job), so there ``TcpCommunicator`` stands in for
``MPICommunicator``: the same methods with the same meaning, for the engine, compressed
exchange and the control path, over the mesh's already-open connections. A connection that
fails surfaces as ``PeerLostError``, the error elastic training recovers from; the mesh is
closed at once so that every rank blocked on this one fails too instead of hanging.

The all-reduce (and the reduce-scatter) is always the rank-ordered one: each rank receives
every rank's copy of its own block (an all-to-all) and reduces them in rank order
0, 1, ..., p-1, then the reduced blocks are all-gathered. Every rank thus gets the same bits,
the bits of ``dlcomm.collectives.ordered`` (both reduce with ``rank_order``), whatever the
buffer size or fusion.

Messages between two ranks arrive in the order sent (one TCP stream per pair), so there are
no tags: every rank must make the same calls in the same order, on all the communicators
that share one mesh together. The engine does (it uses all its communicators from its one
thread), which is why ``dup()``, ``with_algorithm()`` and ``split()`` can share the mesh.
"""
from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlcomm.array_api import from_host, to_host
from dlcomm.comm.rank_order import reduce_in_rank_order
from dlcomm.comm.tcp_mesh import MeshError, TcpMesh
from dlcomm.errors import DLCommError, PeerLostError
from dlcomm.ops import ReduceOp, as_reduce_op

# A buffer whose copies from all ranks fit in this many bytes is all-gathered whole and
# reduced in the same rank order: the same bits in one round of messages instead of two
# (``dlcomm.collectives.ordered.SMALL_GATHER_BYTES``; negotiation's words take this path).
SMALL_GATHER_BYTES = 64 * 1024

_UFUNCS: dict[ReduceOp, np.ufunc] = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVERAGE: np.add,  # as MPICommunicator: the wire sums, the engine divides after
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


class UnsupportedInElasticError(DLCommError, NotImplementedError):
    """A feature that needs MPI (non-blocking messages, sub-communicators, host topology)
    was asked of an elastic job's TCP communicator."""


def _unsupported(what: str) -> UnsupportedInElasticError:
    return UnsupportedInElasticError(
        f"{what} is not available in elastic (TCP) jobs: their communicator is a TCP mesh "
        "without MPI; run the job under dlcommrun/mpirun (not elastic) to use it")


def _combine(op: object) -> np.ufunc:
    """The ufunc that combines two blocks for ``op`` (a ``ReduceOp`` or its name)."""
    return _UFUNCS[as_reduce_op(op)]


def _equal_counts(total: int, parts: int) -> list[int]:
    """``total`` elements in ``parts`` blocks differing by at most one, the larger first
    (``dlcomm.collectives.chunking.equal_counts``: the same split on every rank)."""
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def _offsets(counts: Sequence[int]) -> list[int]:
    """Where each block starts, and the end: ``len(counts) + 1`` values."""
    out = [0]
    for count in counts:
        out.append(out[-1] + int(count))
    return out


def _flat(buf: np.ndarray, what: str) -> np.ndarray:
    """``buf`` as a 1-D view (never a copy: results must land in the caller's memory)."""
    if not buf.flags.c_contiguous:
        raise ValueError(f"{what} must be a contiguous array")
    return buf.reshape(-1)


class _Completed:
    """A non-blocking operation that already completed (every operation here blocks)."""

    __slots__ = ()

    def test(self) -> bool:
        return True


_COMPLETED = _Completed()


class _CompletedRequests:
    """``request_list()``: every request added has completed, so ``wait_some`` returns the
    keys added since the last call."""

    def __init__(self) -> None:
        self._keys: list[Any] = []
        self.pending = 0

    def add(self, request: Any, key: Any) -> None:
        self._keys.append(key)
        self.pending += 1

    def wait_some(self) -> list[Any]:
        keys, self._keys, self.pending = self._keys, [], 0
        return keys


class _MeshState:
    """What every communicator over one mesh shares: the mesh and whether it was closed
    (by ``free()``, or because a peer was lost: ``lost`` says how)."""

    def __init__(self, mesh: TcpMesh) -> None:
        self.mesh = mesh
        self.closed = False
        self.lost = ""

    def close(self) -> None:
        self.closed = True
        self.mesh.close()


class _Handle:
    """One communicator's identity, as an MPI communicator handle: what ``with_algorithm``
    and ``plain`` share and ``dup``/``split`` do not (the cache, being freed)."""

    def __init__(self, owns_mesh: bool) -> None:
        self.owns_mesh = owns_mesh
        self.freed = False
        self.cache: dict[Any, Any] = {}


class TcpCommunicator:
    """An ``MPICommunicator``'s methods over ``mesh`` (built collectively beforehand).

    ``dup()`` and ``with_algorithm()`` views share the mesh: freeing any of them closes it
    for all (the engine frees only process-set communicators, and the world's when a peer is
    lost, to make the ranks blocked on this one fail at once). ``split()`` views share it
    too but do not own it: freeing a process set's communicator leaves the world's mesh open.
    """

    def __init__(self, mesh: TcpMesh) -> None:
        self._init(_MeshState(mesh), _Handle(owns_mesh=True))

    def _init(self, state: _MeshState, handle: _Handle) -> None:
        self._state, self._handle = state, handle
        self.mesh = state.mesh
        self.rank, self.size = state.mesh.rank, state.mesh.size

    def _view(self, handle: _Handle) -> TcpCommunicator:
        view = TcpCommunicator.__new__(TcpCommunicator)
        view._init(self._state, handle)
        return view

    @property
    def plain(self) -> TcpCommunicator:
        """This communicator: its all-reduce is already the plain one (what compressed
        exchange runs its rounds on)."""
        return self

    @property
    def freed(self) -> bool:
        """True once ``free()`` released this communicator or its mesh was closed."""
        return self._handle.freed or self._state.closed

    def __repr__(self) -> str:
        return f"TcpCommunicator(rank={self.rank}, size={self.size})"

    # --- moving bytes ----------------------------------------------------------------------
    def _peers(self) -> list[int]:
        return [p for p in range(self.size) if p != self.rank]

    def _check_open(self) -> None:
        if self._state.lost:
            raise PeerLostError(f"the TCP mesh was closed when a peer was lost: "
                                f"{self._state.lost}")
        if self.freed:
            raise DLCommError(f"{self!r} was freed (its TCP mesh is closed)")

    def _exchange(self, sends: dict[int, np.ndarray], recvs: dict[int, np.ndarray]) -> None:
        """``TcpMesh.exchange``; a failed connection closes the mesh (so the peers blocked on
        this rank fail too) and raises ``PeerLostError``."""
        self._check_open()
        try:
            self.mesh.exchange(sends, recvs)
        except MeshError as exc:
            self._state.lost = str(exc)
            self._state.close()
            raise PeerLostError(str(exc)) from exc
        except KeyError as exc:  # the mesh was closed directly, not through free()
            self._state.closed = True
            raise DLCommError(f"{self!r}: the TCP mesh was closed") from exc

    def _check_peer(self, peer: int, what: str) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"{what} must be a rank in [0, {self.size}), got {peer}")

    def _allgather_raw(self, data: np.ndarray) -> list[np.ndarray]:
        """Every rank's bytes (1-D uint8, any length), in rank order: the lengths travel
        first (8 bytes each), then the payloads. This rank's entry is ``data`` itself."""
        peers = self._peers()
        if not peers:
            self._check_open()
            return [data]
        length = np.array([data.nbytes], dtype=np.int64)
        lengths = {p: np.empty(1, dtype=np.int64) for p in peers}
        self._exchange(dict.fromkeys(peers, length), lengths)
        got = {p: np.empty(int(lengths[p][0]), dtype=np.uint8) for p in peers}
        self._exchange(dict.fromkeys(peers, data), got)
        return [data if p == self.rank else got[p] for p in range(self.size)]

    # --- data path (the engine) ------------------------------------------------------------
    def allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp) -> None:
        """Reduce every rank's ``sendbuf`` into ``recvbuf`` (the same array: in place), each
        element in rank order; Average sums (the engine divides)."""
        ufunc = _combine(op)
        if recvbuf.size == 0:
            return
        if sendbuf.size != recvbuf.size:
            raise ValueError(f"sendbuf has {sendbuf.size} elements, recvbuf {recvbuf.size}")
        self._allreduce(_flat(sendbuf, "sendbuf"), _flat(recvbuf, "recvbuf"), ufunc)

    def _allreduce(self, send: np.ndarray, recv: np.ndarray, ufunc: np.ufunc) -> None:
        size, n = self.size, send.size
        if size == 1:
            self._check_open()
            if not np.shares_memory(send, recv):
                np.copyto(recv, send)
            return
        if send.nbytes * size <= SMALL_GATHER_BYTES:
            copies = np.empty((size, n), dtype=send.dtype)
            self._allgatherv(send, copies.reshape(-1), [n] * size)
            reduce_in_rank_order(list(copies), recv, ufunc)
            return
        counts = _equal_counts(n, size)
        block = np.empty(counts[self.rank], dtype=send.dtype)
        self._reduce_scatter(send, block, counts, ufunc)
        # send was consumed by the all-to-all, so recv may be the same memory.
        self._allgatherv(block, recv, counts)

    def reduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                       op: ReduceOp) -> None:
        """Reduce every rank's ``sendbuf`` in rank order; this rank keeps block ``rank``
        (``counts[i]`` elements for rank i) in ``recvbuf``."""
        ufunc = _combine(op)
        if len(counts) != self.size:
            raise ValueError(f"counts has {len(counts)} entries for {self.size} ranks")
        if not sum(counts):
            return
        send, recv = _flat(sendbuf, "sendbuf"), _flat(recvbuf, "recvbuf")
        if send.size != sum(counts) or recv.size != counts[self.rank]:
            raise ValueError(f"sendbuf has {send.size} elements and recvbuf {recv.size}, but "
                             f"counts {list(counts)} need {sum(counts)} and "
                             f"{counts[self.rank]}")
        self._reduce_scatter(send, recv, list(counts), ufunc)

    def _reduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int],
                        ufunc: np.ufunc) -> None:
        at, me, mine = _offsets(counts), self.rank, counts[self.rank]
        own = send[at[me]:at[me + 1]]
        if np.shares_memory(own, recv):
            own = own.copy()
        peers = self._peers()
        copies = {p: np.empty(mine, dtype=send.dtype) for p in peers}  # p's copy of block me
        self._exchange({p: send[at[p]:at[p + 1]] for p in peers}, copies)
        reduce_in_rank_order([own if p == me else copies[p] for p in range(self.size)],
                              recv, ufunc)

    def allgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int]) -> None:
        """Concatenate every rank's ``sendbuf`` (``counts[i]`` elements from rank i) into
        ``recvbuf``, in rank order."""
        if len(counts) != self.size:
            raise ValueError(f"counts has {len(counts)} entries for {self.size} ranks")
        send, recv = _flat(sendbuf, "sendbuf"), _flat(recvbuf, "recvbuf")
        if send.size != counts[self.rank] or recv.size < sum(counts):
            raise ValueError(f"sendbuf has {send.size} elements and recvbuf {recv.size}, but "
                             f"counts {list(counts)} need {counts[self.rank]} and {sum(counts)}")
        self._allgatherv(send, recv, list(counts))

    def _allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        at, me = _offsets(counts), self.rank
        mine = recv[at[me]:at[me + 1]]
        if mine.size and not np.shares_memory(mine, send):
            mine[...] = send
        peers = self._peers()
        self._exchange(dict.fromkeys(peers, send), {p: recv[at[p]:at[p + 1]] for p in peers})

    def alltoallv(self, sendbuf: np.ndarray, sendcounts: list[int], recvbuf: np.ndarray,
                  recvcounts: list[int]) -> None:
        """Rank i's j-th slice (``sendcounts[j]`` elements) lands in rank j's ``recvbuf`` as
        its i-th slice (``recvcounts[i]``)."""
        if len(sendcounts) != self.size or len(recvcounts) != self.size:
            raise ValueError(f"sendcounts and recvcounts need {self.size} entries, got "
                             f"{len(sendcounts)} and {len(recvcounts)}")
        send, recv = _flat(sendbuf, "sendbuf"), _flat(recvbuf, "recvbuf")
        send_at, recv_at, me = _offsets(sendcounts), _offsets(recvcounts), self.rank
        if send.size < send_at[-1] or recv.size < recv_at[-1]:
            raise ValueError(f"sendbuf has {send.size} elements and recvbuf {recv.size}, but "
                             f"the counts need {send_at[-1]} and {recv_at[-1]}")
        if recvcounts[me] != sendcounts[me]:
            raise ValueError(f"this rank sends itself {sendcounts[me]} elements but expects "
                             f"{recvcounts[me]}")
        recv[recv_at[me]:recv_at[me + 1]] = send[send_at[me]:send_at[me + 1]]
        peers = self._peers()
        self._exchange({p: send[send_at[p]:send_at[p + 1]] for p in peers},
                       {p: recv[recv_at[p]:recv_at[p + 1]] for p in peers})

    def bcast(self, buf: np.ndarray, root: int) -> None:
        """Copy ``root``'s ``buf`` into every rank's ``buf`` (the root sends to each peer)."""
        self._check_peer(root, "root")
        if buf.size == 0 or self.size == 1:
            return
        data = _flat(buf, "buf")
        if self.rank == root:
            self._exchange(dict.fromkeys(self._peers(), data), {})
        else:
            self._exchange({}, {root: data})

    # --- control path (negotiation) --------------------------------------------------------
    def iallreduce_band(self, words: np.ndarray) -> _Completed:
        """Bitwise-AND all-reduce of ``words`` (uint64), in place; done when it returns
        (the request's ``test()`` is already True)."""
        if words.size:
            flat = _flat(words, "words")
            self._allreduce(flat, flat, np.bitwise_and)
        return _COMPLETED

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's byte string (any length), in rank order."""
        parts = self._allgather_raw(np.frombuffer(payload, dtype=np.uint8))
        return [bytes(payload) if p == self.rank else parts[p].tobytes()
                for p in range(self.size)]

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        """``root``'s picklable ``obj`` on every rank (a copy on the root too, as MPI's)."""
        self._check_peer(root, "root")
        self._check_open()
        if self.rank == root:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            data = np.frombuffer(payload, dtype=np.uint8)
            length = np.array([data.nbytes], dtype=np.int64)
            peers = self._peers()
            if peers:
                self._exchange(dict.fromkeys(peers, length), {})
                self._exchange(dict.fromkeys(peers, data), {})
            return pickle.loads(payload)
        length = np.empty(1, dtype=np.int64)
        self._exchange({}, {root: length})
        data = np.empty(int(length[0]), dtype=np.uint8)
        self._exchange({}, {root: data})
        return pickle.loads(memoryview(data))

    # --- arrays of any size (compressed exchange) and values --------------------------------
    def allreduce_sum(self, arr: Any) -> Any:
        """Element-wise sum of ``arr`` over ranks, as a new array (CuPy staged via the host)."""
        host = np.ascontiguousarray(to_host(arr))
        out = np.empty_like(host)
        if out.size:
            self._allreduce(host.reshape(-1), out.reshape(-1), np.add)
        else:
            self._check_open()
        return from_host(out, arr)

    def allgather(self, value: Any) -> list:
        """Every rank's ``value`` in rank order. Arrays (numpy or CuPy) travel as bytes and
        come back 1-D (sizes may differ, dtype may not); other values are pickled."""
        if not (isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__")):
            payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            parts = self._allgather_raw(np.frombuffer(payload, dtype=np.uint8))
            return [pickle.loads(memoryview(part)) for part in parts]
        host = np.ascontiguousarray(to_host(value)).reshape(-1)
        mine = host.view(np.uint8)
        parts = self._allgather_raw(mine)
        return [from_host((mine.copy() if part is mine else part).view(host.dtype), value)
                for part in parts]

    def sendrecv(self, arr: Any, peer: int) -> Any:
        """Send 1-D ``arr`` to ``peer`` and return what ``peer`` sent (any size, same dtype)."""
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"peer must be another rank in [0, {self.size}), got {peer}")
        host = np.ascontiguousarray(to_host(arr)).reshape(-1)
        length = np.empty(1, dtype=np.int64)
        self._exchange({peer: np.array([host.nbytes], dtype=np.int64)}, {peer: length})
        recv = np.empty(int(length[0]), dtype=np.uint8)
        self._exchange({peer: host.view(np.uint8)}, {peer: recv})
        return from_host(recv.view(host.dtype), arr)

    # --- point-to-point into given buffers (collective algorithms) --------------------------
    def send(self, buf: np.ndarray, dest: int, tag: int) -> None:
        """Send the bytes of contiguous ``buf`` to ``dest``; ``tag`` is unused (the messages
        of a pair of ranks arrive in the order sent)."""
        self._check_other(dest, "dest")
        self._exchange({dest: _flat(buf, "buf")}, {})

    def recv(self, buf: np.ndarray, source: int, tag: int) -> None:
        """Receive exactly ``buf.nbytes`` bytes from ``source`` into contiguous ``buf``."""
        self._check_other(source, "source")
        self._exchange({}, {source: _flat(buf, "buf")})

    def sendrecv_into(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int,
                      tag: int) -> None:
        """Send ``sendbuf`` to ``dest`` while receiving ``recvbuf`` from ``source``."""
        self._check_peer(dest, "dest")
        self._check_peer(source, "source")
        send, recv = _flat(sendbuf, "sendbuf"), _flat(recvbuf, "recvbuf")
        if dest == self.rank and source == self.rank:  # a message to oneself, as MPI allows
            self._check_open()
            recv.view(np.uint8)[...] = send.view(np.uint8)
            return
        self._check_other(dest, "dest")
        self._check_other(source, "source")
        self._exchange({dest: send}, {source: recv})

    def _check_other(self, peer: int, what: str) -> None:
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"{what} must be another rank in [0, {self.size}), got {peer}")

    def isend(self, buf: np.ndarray, dest: int, tag: int) -> Any:
        """Not available: a non-blocking message needs MPI's progress engine."""
        raise _unsupported("isend (non-blocking messages, used by the heterogeneity "
                           "algorithms and pipelined collectives)")

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> Any:
        """Not available: a non-blocking message needs MPI's progress engine."""
        raise _unsupported("irecv (non-blocking messages, used by the heterogeneity "
                           "algorithms and pipelined collectives)")

    def barrier(self) -> None:
        """Return once every rank entered the barrier (one byte to and from every peer)."""
        peers = self._peers()
        token = np.ones(1, dtype=np.uint8)
        self._exchange(dict.fromkeys(peers, token),
                       {p: np.empty(1, dtype=np.uint8) for p in peers})

    def ibarrier(self) -> _Completed:
        """A barrier, done when it returns (the request's ``test()`` is already True)."""
        self.barrier()
        return _COMPLETED

    def iallgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> _Completed:
        """Gather every rank's equal-sized ``sendbuf`` into ``recvbuf`` (rank order); done
        when it returns."""
        send = _flat(sendbuf, "sendbuf")
        self.allgatherv(send, recvbuf, [send.size] * self.size)
        return _COMPLETED

    def iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp) -> _Completed:
        """``allreduce``, done when it returns (the request's ``test()`` is already True)."""
        self.allreduce(sendbuf, recvbuf, op)
        return _COMPLETED

    # --- small control messages ---------------------------------------------------------------
    def isend_object(self, obj: Any, dest: int, tag: int) -> Any:
        """Not available: announcements to any rank need MPI's matching of tags."""
        raise _unsupported("isend_object (announcements of the heterogeneity algorithms)")

    def poll_object(self, tag: int) -> tuple[int, Any] | None:
        """Not available: receiving from any rank needs MPI's matching of tags."""
        raise _unsupported("poll_object (announcements of the heterogeneity algorithms)")

    # --- communicators -----------------------------------------------------------------------
    def split(self, color: int | None, key: int) -> TcpCommunicator | None:
        """Collective. Only the splits that keep every rank where it is: every rank passing
        the same color with keys in rank order (a view over the same mesh), or every rank
        passing None (None). Anything else raises ``UnsupportedInElasticError`` on every
        rank (the colors and keys are gathered first, so all ranks decide alike)."""
        choices = self.allgather((color, key))
        colors = {c for c, _k in choices}
        keys = [k for _c, k in choices]
        if colors == {None}:
            return None
        if len(colors) == 1 and all(a <= b for a, b in zip(keys, keys[1:])):
            return self._view(_Handle(owns_mesh=False))
        raise _unsupported(
            f"splitting into sub-communicators (colors {[c for c, _k in choices]}, keys "
            f"{keys}; process sets other than all ranks, or hierarchical compression's host "
            "groups)")

    def split_by_host(self, key: int) -> TcpCommunicator:
        """Not available: an elastic job knows no host topology."""
        raise _unsupported("split_by_host (the ranks of one host: hierarchical algorithms "
                           "and compression's host groups)")

    def dup(self) -> TcpCommunicator:
        """A communicator over the same mesh (own cache; freeing it closes the mesh).
        Sharing the mesh is safe because every rank uses all its communicators in the same
        order, from one thread."""
        return self._view(_Handle(owns_mesh=True))

    def with_algorithm(self, algorithm: Any, reduce_scatter_algorithm: Any = None,
                       allgather_algorithm: Any = None) -> TcpCommunicator:
        """This communicator (same cache): the algorithms are ignored, because the all-reduce
        here is always the rank-ordered reduce-scatter + all-gather over the mesh (the bits
        of ``ordered``; MPI's algorithms and the point-to-point ones need MPI)."""
        return self._view(self._handle)

    def request_list(self) -> _CompletedRequests:
        """An empty list of requests to wait on together (all complete on creation here)."""
        return _CompletedRequests()

    def test_all(self, requests: Sequence[Any]) -> bool:
        """True once every request completed."""
        return all(r.test() for r in requests)

    def free(self) -> None:
        """Release this communicator (idempotent): free what was cached on it and, unless it
        came from ``split()``, close the mesh (for every view of it)."""
        handle = self._handle
        if handle.freed:
            return
        handle.freed = True
        cached, handle.cache = list(handle.cache.values()), {}
        for value in cached:
            free = getattr(value, "free", None)
            if free is not None:
                free()
        if handle.owns_mesh:
            self._state.close()

    def peek_cached(self, key: Any) -> Any:
        """The value cached under ``key``, or None when nothing was built yet (never
        collective)."""
        return None if self.freed else self._handle.cache.get(key)

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """The value cached on this communicator under ``key``, built by ``build()`` on first
        use; values with a ``free()`` method are freed when the communicator is."""
        cache = self._handle.cache
        if key not in cache:
            cache[key] = build()
        return cache[key]
