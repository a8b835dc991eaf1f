"""The MPI transport (mpi4py): every MPI call dlcomm makes after start-up goes through here.

``MPICommunicator`` gives each user what it needs over one mpi4py communicator: the engine's
collectives and negotiation, compressed exchange's array rounds (``allreduce_sum``,
``allgather``, ``sendrecv``), the point-to-point messages of ``dlcomm.collectives`` and the
non-blocking messages and barrier of the heterogeneity algorithms. An MPI failure is raised
as ``TransportError`` (a ``DLCommError``) with MPI's own description.
"""
from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from dlcomm import kernels
from dlcomm.array_api import from_host, to_host
from dlcomm.comm.polling import wait_polling
from dlcomm.comm.tcp_communicator import TcpCommunicator
from dlcomm.config import knob_value
from dlcomm.errors import DLCommError
from dlcomm.ops import ReduceOp, as_reduce_op

_MPI_OPS = {
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.AVERAGE: MPI.SUM,  # the engine divides after the sum
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}

# MPI has no half-precision type: float16 travels as 2-byte integers. And Open MPI 4.1's
# vectorised ops saturate 8- and 16-bit integer sums (255 + 1 -> 255) where every other
# dtype wraps. Both are combined by user-defined ops that reinterpret the bytes with numpy
# (commutative, so MPI may use any algorithm). These are the only user-defined MPI ops.
_NUMPY_REDUCED = frozenset(np.dtype(t) for t in
                           (np.float16, np.int8, np.uint8, np.int16, np.uint16))
_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVERAGE: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}
_numpy_ops: dict[tuple[np.dtype, ReduceOp], MPI.Op] = {}

F = TypeVar("F", bound=Callable)


class TransportError(DLCommError):
    """An MPI call failed; the message carries MPI's description of the error."""


MPI_WAITS = ("poll", "block")


def mpi_wait_mode(mpi_wait: str | None = None) -> str:
    """How the data path waits for MPI: ``poll`` (test, then sleep: the CPU stays free for
    the ranks being waited for) or ``block`` (MPI's own blocking calls, which busy-poll);
    ``mpi_wait``, else ``DLCOMM_MPI_WAIT``, else ``poll``. ValueError for anything else."""
    value = knob_value("mpi_wait", mpi_wait)
    name = str(value).strip().lower()
    if name not in MPI_WAITS:
        raise ValueError(f"mpi_wait must be one of {', '.join(MPI_WAITS)}, got {value!r}")
    return name


def _raising_transport_errors(func: F) -> F:
    """Turn an ``MPI.Exception`` raised inside ``func`` into a ``TransportError``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except MPI.Exception as exc:
            raise TransportError(f"{func.__name__}: {exc.Get_error_string()}") from exc

    return wrapper  # type: ignore[return-value]


def _float16_add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    # numpy's float16 add runs at a few hundred MB/s; the kernel returns the same bits
    # (tests/unit/test_kernels.py) about 10x faster. Looked up at each call (tests count it).
    kernels.float16_add_(a, out)


def _numpy_op(dtype: np.dtype, op: ReduceOp) -> MPI.Op:
    key = (dtype, op)
    if key not in _numpy_ops:
        ufunc = _UFUNCS[op]
        if dtype == np.float16 and ufunc is np.add and kernels.available():
            ufunc = _float16_add

        def combine(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
            a = np.frombuffer(inbuf, dtype=dtype)
            b = np.frombuffer(inoutbuf, dtype=dtype)
            ufunc(a, b, out=b)

        _numpy_ops[key] = MPI.Op.Create(combine, commute=True)
    return _numpy_ops[key]


def mpi_op(op: object) -> MPI.Op:
    """MPI's predefined operator for ``op`` (a ``ReduceOp`` or its name; Average sums)."""
    return _MPI_OPS[as_reduce_op(op)]


def _wire(buf: np.ndarray) -> np.ndarray:
    """View ``buf`` as a dtype MPI knows (float16 as int16, bool as uint8); no copy."""
    if buf.dtype == np.float16:
        return buf.view(np.int16)
    if buf.dtype == np.bool_:
        return buf.view(np.uint8)
    return buf


def _reduce_op(dtype: np.dtype, op: ReduceOp) -> MPI.Op:
    return _numpy_op(dtype, op) if dtype in _NUMPY_REDUCED else _MPI_OPS[op]


def _bytes(buf: np.ndarray) -> np.ndarray:
    """The bytes of a contiguous array (a ``uint8`` view), the form point-to-point uses."""
    return buf.reshape(-1).view(np.uint8)


def _displacements(counts: Sequence[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


class MPIRequest:
    """A non-blocking operation; ``test()`` is True once it completed. Keeps the buffers it
    reads or writes alive until then."""

    __slots__ = ("_req", "_buffers")

    def __init__(self, req: MPI.Request, *buffers: Any) -> None:
        self._req = req
        self._buffers = buffers

    def test(self) -> bool:
        return bool(self._req.Test())


class MPIRequestList:
    """Non-blocking operations waited on together: ``add`` each with a key, ``wait_some``
    waits until at least one completes (``MPI_Testsome`` between sleeps, or ``MPI_Waitsome``
    with ``poll=False``; the GIL released either way) and returns the keys of those that
    did. Completed entries are dropped from the list now and then, so a long pipeline of
    messages keeps every wait proportional to what is still pending."""

    __slots__ = ("_raw", "_keys", "_held", "pending", "_poll")

    def __init__(self, poll: bool = True) -> None:
        self._raw: list[MPI.Request] = []
        self._keys: list[Any] = []
        self._held: list[Any] = []  # the MPIRequests: they keep their buffers alive
        self.pending = 0
        self._poll = poll

    def add(self, request: MPIRequest, key: Any) -> None:
        """Wait for ``request`` (from ``isend``/``irecv``) as part of this list."""
        self._raw.append(request._req)
        self._keys.append(key)
        self._held.append(request)
        self.pending += 1

    @_raising_transport_errors
    def wait_some(self) -> list[Any]:
        """Keys of the requests that completed; blocks until there is at least one. An empty
        list when nothing is pending."""
        if not self.pending:
            return []
        if self._poll:
            found: list[int] = []

            def test() -> bool:
                found.extend(MPI.Request.Testsome(self._raw) or [])
                return bool(found)

            wait_polling(test)
            done = found
        else:
            done = MPI.Request.Waitsome(self._raw) or []
        keys = [self._keys[i] for i in done]
        for i in done:
            self._held[i] = None
        self.pending -= len(done)
        if len(self._raw) > 16 and self.pending * 2 < len(self._raw):
            live = [i for i, r in enumerate(self._raw) if r != MPI.REQUEST_NULL]
            self._raw = [self._raw[i] for i in live]
            self._keys = [self._keys[i] for i in live]
            self._held = [self._held[i] for i in live]
        return keys


def _free_cached(comm: MPI.Comm, keyval: int, cache: dict) -> None:
    """MPI attribute delete callback: free what was cached on ``comm`` when it is freed."""
    for value in cache.values():
        free = getattr(value, "free", None)
        if free is not None:
            free()


_CACHE_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_free_cached)


class MPICommunicator:
    """A ``Communicator`` over an ``mpi4py`` communicator (host numpy arrays).

    ``algorithm`` replaces MPI's own all-reduce by a ``dlcomm.collectives`` algorithm
    (``algorithm(comm, sendbuf, recvbuf, op)``, run on this communicator without it). A
    wrapper compares equal to the mpi4py communicator it wraps (``== MPI.COMM_NULL`` once
    freed).
    """

    def __init__(self, comm: MPI.Comm, algorithm: Any = None,
                 reduce_scatter_algorithm: Any = None, allgather_algorithm: Any = None) -> None:
        self.comm = comm
        null = comm == MPI.COMM_NULL
        self.rank = -1 if null else comm.Get_rank()
        self.size = 0 if null else comm.Get_size()
        self.algorithm = algorithm
        self._plain: MPICommunicator | None = None if algorithm is not None else self
        # The reduce-scatter that reduces like that all-reduce (the ``ordered`` pair, so a
        # reduce-scatter + all-gather gives the all-reduce's bits); None: MPI's own.
        self.reduce_scatter_algorithm = reduce_scatter_algorithm
        # ``allgather_algorithm(comm, sendbuf, recvbuf, counts)`` replaces MPI's all-gather
        # (exact either way: it only chooses the transport); None: MPI's own.
        self.allgather_algorithm = allgather_algorithm
        if reduce_scatter_algorithm is not None or allgather_algorithm is not None:
            self._plain = None
        # Open MPI's blocking calls spin: where ranks share cores, a waiting rank would take
        # the CPU of the ranks it waits for (the data path polls unless DLCOMM_MPI_WAIT=block).
        self.poll = mpi_wait_mode() == "poll"

    def _finish(self, *requests: MPI.Request) -> None:
        """Wait for non-blocking operations: by polling (sleeps between tests) or, with
        ``DLCOMM_MPI_WAIT=block``, in ``MPI_Waitall``."""
        if self.poll:
            wait_polling(lambda: bool(MPI.Request.Testall(requests)))
        else:
            MPI.Request.Waitall(requests)

    def _gathered_sizes(self, nbytes: int) -> np.ndarray:
        """Every rank's ``nbytes`` in rank order (int64), waited on like the data path."""
        mine, sizes = np.array([nbytes], dtype=np.int64), np.empty(self.size, np.int64)
        self._finish(self.comm.Iallgather(mine, sizes))  # ``mine`` alive until done
        return sizes

    @property
    def plain(self) -> MPICommunicator:
        """This communicator with MPI's own all-reduce (what an algorithm runs on)."""
        if self._plain is None:
            self._plain = MPICommunicator(self.comm)
        return self._plain

    @property
    def freed(self) -> bool:
        """True once ``free()`` released the communicator (or it never existed here)."""
        return self.comm == MPI.COMM_NULL

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MPICommunicator):
            other = other.comm
        return bool(self.comm == other)

    def __hash__(self) -> int:
        return id(self.comm)

    def __repr__(self) -> str:
        return f"MPICommunicator(rank={self.rank}, size={self.size})"

    # --- data path (the engine) ------------------------------------------------------
    @_raising_transport_errors
    def allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp) -> None:
        if recvbuf.size == 0:
            return
        if self.algorithm is not None:
            wire_op = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
            self.algorithm(self.plain, sendbuf, recvbuf, wire_op)
            return
        send = MPI.IN_PLACE if sendbuf is recvbuf else _wire(sendbuf)
        # MPI's own reductions stay blocking: Open MPI's non-blocking all-reduce (libnbc)
        # took 1.2-4x as long at 8-256 KiB on the emulated cluster (docs/collectives.md).
        self.comm.Allreduce(send, _wire(recvbuf), op=_reduce_op(recvbuf.dtype, op))

    @_raising_transport_errors
    def allgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int]) -> None:
        if self.allgather_algorithm is not None:
            self.allgather_algorithm(self.plain, sendbuf, recvbuf, list(counts))
            return
        if counts and all(c == counts[0] for c in counts):
            # Open MPI's tuned Allgather picks better algorithms than its Allgatherv for the
            # same bytes (docs/collectives.md): use it whenever the blocks are equal.
            self._finish(self.comm.Iallgather(_wire(sendbuf), _wire(recvbuf)))
            return
        self._finish(self.comm.Iallgatherv(
            _wire(sendbuf), [_wire(recvbuf), (counts, _displacements(counts))]))

    @_raising_transport_errors
    def bcast(self, buf: np.ndarray, root: int) -> None:
        if buf.size:
            self._finish(self.comm.Ibcast(_wire(buf), root=root))

    @_raising_transport_errors
    def alltoallv(self, sendbuf: np.ndarray, sendcounts: list[int], recvbuf: np.ndarray,
                  recvcounts: list[int]) -> None:
        self._finish(self.comm.Ialltoallv(
            [_wire(sendbuf), (sendcounts, _displacements(sendcounts))],
            [_wire(recvbuf), (recvcounts, _displacements(recvcounts))],
        ))

    @_raising_transport_errors
    def reduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                       op: ReduceOp) -> None:
        if not sum(counts):
            return
        if self.reduce_scatter_algorithm is not None:
            wire_op = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
            self.reduce_scatter_algorithm(self.plain, sendbuf, recvbuf, counts, wire_op)
            return
        self.comm.Reduce_scatter(_wire(sendbuf), _wire(recvbuf), recvcounts=counts,
                                 op=_reduce_op(sendbuf.dtype, op))  # blocking, as Allreduce

    # --- control path (negotiation) ------------------------------------------------------
    def iallreduce_band(self, words: np.ndarray) -> MPIRequest:
        """Start a bitwise-AND all-reduce of ``words`` (uint64), in place."""
        return MPIRequest(self.comm.Iallreduce(MPI.IN_PLACE, words, op=MPI.BAND), words)

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        """All-gather byte strings of any length (two collectives, no pickling)."""
        sizes = self._gathered_sizes(len(payload))
        recv = np.empty(int(sizes.sum()), dtype=np.uint8)
        self._finish(self.comm.Iallgatherv(np.frombuffer(payload, dtype=np.uint8),
                                           [recv, sizes.tolist()]))
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        return [recv[offsets[i]:offsets[i + 1]].tobytes() for i in range(self.size)]

    @_raising_transport_errors
    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        """``root``'s picklable ``obj`` on every rank."""
        return self.comm.bcast(obj, root=root)

    # --- arrays of any size (compressed exchange) and values ------------------------------
    @_raising_transport_errors
    def allreduce_sum(self, arr: Any) -> Any:
        """Element-wise sum of ``arr`` over ranks, as a new array (CuPy staged via the host)."""
        host = np.ascontiguousarray(to_host(arr))
        out = np.empty_like(host)
        if out.size:
            self.plain.allreduce(host.reshape(-1), out.reshape(-1), ReduceOp.SUM)
        return from_host(out, arr)

    @_raising_transport_errors
    def allgather(self, value: Any) -> list:
        """Every rank's ``value`` in rank order. Arrays (numpy or CuPy) travel as bytes and
        come back 1-D (sizes may differ, dtype may not); other values are pickled."""
        if not (isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__")):
            return self.comm.allgather(value)
        host = np.ascontiguousarray(to_host(value)).reshape(-1)
        counts = self._gathered_sizes(host.nbytes).tolist()
        recv = np.empty(sum(counts), dtype=np.uint8)
        self._finish(self.comm.Iallgatherv(host.view(np.uint8), [recv, counts, MPI.BYTE]))
        bounds = np.cumsum([0, *counts])
        return [from_host(recv[lo:hi].view(host.dtype), value)
                for lo, hi in zip(bounds, bounds[1:])]

    @_raising_transport_errors
    def sendrecv(self, arr: Any, peer: int) -> Any:
        """Send 1-D ``arr`` to ``peer`` and return what ``peer`` sent (any size, same dtype)."""
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"peer must be another rank in [0, {self.size}), got {peer}")
        host = np.ascontiguousarray(to_host(arr)).reshape(-1)
        mine, theirs = np.array([host.nbytes], dtype=np.int64), np.empty(1, dtype=np.int64)
        self._finish(self.comm.Isend(mine, dest=peer), self.comm.Irecv(theirs, source=peer))
        recv = np.empty(int(theirs[0]), dtype=np.uint8)
        self._finish(self.comm.Isend([host.view(np.uint8), MPI.BYTE], dest=peer),
                     self.comm.Irecv([recv, MPI.BYTE], source=peer))
        return from_host(recv.view(host.dtype), arr)

    # --- point-to-point into given buffers (collective algorithms, heterogeneity) ---------
    @_raising_transport_errors
    def send(self, buf: np.ndarray, dest: int, tag: int) -> None:
        """Send the bytes of contiguous ``buf`` to ``dest``; returns once sent."""
        self._finish(self.comm.Isend(_bytes(buf), dest, tag))

    @_raising_transport_errors
    def recv(self, buf: np.ndarray, source: int, tag: int) -> None:
        """Receive exactly ``buf.nbytes`` bytes from ``source`` into contiguous ``buf``."""
        self._finish(self.comm.Irecv(_bytes(buf), source, tag))

    @_raising_transport_errors
    def sendrecv_into(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int,
                      tag: int) -> None:
        """Send ``sendbuf`` to ``dest`` while receiving ``recvbuf`` from ``source``."""
        self._finish(self.comm.Irecv(_bytes(recvbuf), source, tag),
                     self.comm.Isend(_bytes(sendbuf), dest, tag))

    @_raising_transport_errors
    def isend(self, buf: np.ndarray, dest: int, tag: int) -> MPIRequest:
        """Start sending contiguous ``buf`` to ``dest``; keep ``buf`` unchanged until done."""
        data = _bytes(buf)
        return MPIRequest(self.comm.Isend(data, dest=dest, tag=tag), data)

    @_raising_transport_errors
    def irecv(self, buf: np.ndarray, source: int, tag: int) -> MPIRequest:
        """Start receiving ``buf.nbytes`` bytes from ``source`` into contiguous ``buf``."""
        data = _bytes(buf)
        return MPIRequest(self.comm.Irecv(data, source=source, tag=tag), data)

    @_raising_transport_errors
    def barrier(self) -> None:
        """Return once every rank entered the barrier."""
        self._finish(self.comm.Ibarrier())

    def ibarrier(self) -> MPIRequest:
        """Start a barrier; ``test()`` is True once every rank entered it."""
        return MPIRequest(self.comm.Ibarrier())

    @_raising_transport_errors
    def iallgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> MPIRequest:
        """Start gathering every rank's equal-sized ``sendbuf`` into ``recvbuf`` (rank order);
        doubles as a barrier that carries a few words per rank."""
        return MPIRequest(self.comm.Iallgather(_wire(sendbuf), _wire(recvbuf)), sendbuf, recvbuf)

    @_raising_transport_errors
    def iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp) -> MPIRequest:
        """Start MPI's own all-reduce of ``sendbuf`` into ``recvbuf`` (the same array: in
        place), for a caller that must be able to stop waiting for a member that will not come."""
        send = MPI.IN_PLACE if sendbuf is recvbuf else _wire(sendbuf)
        request = self.comm.Iallreduce(send, _wire(recvbuf), op=_reduce_op(recvbuf.dtype, op))
        return MPIRequest(request, sendbuf, recvbuf)

    # --- small control messages (pickled objects) ------------------------------------------
    @_raising_transport_errors
    def isend_object(self, obj: Any, dest: int, tag: int) -> MPIRequest:
        """Start sending a small picklable ``obj`` to ``dest`` (an announcement, not data)."""
        return MPIRequest(self.comm.isend(obj, dest=dest, tag=tag))

    @_raising_transport_errors
    def poll_object(self, tag: int) -> tuple[int, Any] | None:
        """The next object sent with ``tag`` by any rank, as ``(source, obj)``, or None when
        none has arrived (never blocks for a message that is not there)."""
        status = MPI.Status()
        if not self.comm.iprobe(source=MPI.ANY_SOURCE, tag=tag, status=status):
            return None
        source = status.Get_source()
        return source, self.comm.recv(source=source, tag=tag)

    # --- communicators ---------------------------------------------------------------------
    def split(self, color: int | None, key: int) -> MPICommunicator | None:
        """Collective over this communicator; ranks passing ``None`` get ``None``."""
        sub = self.comm.Split(MPI.UNDEFINED if color is None else color, key)
        return None if sub == MPI.COMM_NULL else MPICommunicator(
            sub, self.algorithm, self.reduce_scatter_algorithm, self.allgather_algorithm)

    def split_by_host(self, key: int) -> MPICommunicator:
        """Collective: the ranks of this communicator that share memory with this one."""
        return MPICommunicator(self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=key))

    def dup(self) -> MPICommunicator:
        return MPICommunicator(self.comm.Dup(), self.algorithm, self.reduce_scatter_algorithm,
                               self.allgather_algorithm)

    def with_algorithm(self, algorithm: Any, reduce_scatter_algorithm: Any = None,
                       allgather_algorithm: Any = None) -> MPICommunicator:
        """The same communicator, all-reducing with ``algorithm``, reduce-scattering with
        ``reduce_scatter_algorithm`` and all-gathering with ``allgather_algorithm`` (None:
        MPI's own)."""
        return MPICommunicator(self.comm, algorithm, reduce_scatter_algorithm,
                               allgather_algorithm)

    def request_list(self) -> MPIRequestList:
        """An empty list of requests to wait on together (``MPIRequestList``), waited on
        as this communicator's collectives are (``DLCOMM_MPI_WAIT``)."""
        return MPIRequestList(self.poll)

    def test_all(self, requests: Sequence[MPIRequest]) -> bool:
        """True once every request completed (``MPI_Testall``, driving their progress)."""
        return bool(MPI.Request.Testall([r._req for r in requests]))

    def free(self) -> None:
        """Release the communicator (collective); world, self and freed ones are kept."""
        if (self.comm not in (MPI.COMM_WORLD, MPI.COMM_SELF, MPI.COMM_NULL)
                and not MPI.Is_finalized()):
            self.comm.Free()

    def peek_cached(self, key: Any) -> Any:
        """The value cached under ``key``, or None when nothing was built yet (never
        collective: for readers that must not start a build on one rank only)."""
        if self.freed:
            return None
        cache = self.comm.Get_attr(_CACHE_KEYVAL)
        return None if cache is None else cache.get(key)

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """The value cached on this communicator under ``key``, built by ``build()`` on first
        use; values with a ``free()`` method are freed when the communicator is."""
        cache = self.comm.Get_attr(_CACHE_KEYVAL)
        if cache is None:
            cache = {}
            self.comm.Set_attr(_CACHE_KEYVAL, cache)
        if key not in cache:
            cache[key] = build()
        return cache[key]


NULL = MPICommunicator(MPI.COMM_NULL)  # stands for "no communicator on this rank"


def as_communicator(comm: object) -> MPICommunicator | TcpCommunicator:
    """``comm`` as a transport communicator: an ``MPICommunicator`` (or an elastic job's
    ``TcpCommunicator``) as it is, an mpi4py
    intracommunicator (``MPI.COMM_WORLD``, a Split or Dup of it) wrapped."""
    if isinstance(comm, (MPICommunicator, TcpCommunicator)):
        if comm.freed:
            raise ValueError("comm was freed (or is MPI.COMM_NULL on this rank)")
        return comm
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py MPI.Intracomm (e.g. MPI.COMM_WORLD) or a "
                        f"dlcomm communicator, got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL: this rank is not part of the communicator")
    return MPICommunicator(comm)


def dumps(obj: Any) -> bytes:
    """Serialise a control message (negotiation announcements)."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


loads = pickle.loads
