"""The background engine: one thread per process owns all communication.

Each cycle: take the requests the user thread queued, agree with every rank on which named
requests are ready everywhere (one bitwise-AND all-reduce when the response cache knows
them all, an all-gather of announcements otherwise), then execute the ready ones in one
global order, fusing small all-reduces. Ranks may submit in different orders; nothing runs
until every rank that must take part has submitted it.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import threading
import time
from typing import Any

import numpy as np

from dlcomm.collectives.registry import (
    ALLGATHERS,
    REDUCE_SCATTERS,
    algorithm_name_from_env,
    get_allreduce_algorithm,
)
from dlcomm.collectives.selection import built_model
from dlcomm.comm.counting import ByteCounter
from dlcomm.comm.machine import crowded_across_hosts
from dlcomm.comm.mesh_communicator import mesh_communicator, mesh_setting
from dlcomm.comm.mpi_backend import MPICommunicator, dumps, loads
from dlcomm.comm.polling import wait_polling
from dlcomm.config import Config
from dlcomm.engine.executor import Executor
from dlcomm.engine.fusion import bucket_bytes
from dlcomm.engine.negotiation import WORLD, Coordinator, Response
from dlcomm.engine.process_sets import ProcessSetState
from dlcomm.engine.request import CACHEABLE, Handle, Kind, Request, Signature
from dlcomm.engine.response_cache import ResponseCache
from dlcomm.engine.stall import StallInspector
from dlcomm.engine.timeline import open_timeline
from dlcomm.errors import DLCommError, PeerLostError, ShutdownError, StallError

log = logging.getLogger("dlcomm")

_NO_UNCACHED = np.uint64(1)  # flag bit: this rank needs no full negotiation round
_IDLE = np.uint64(2)  # flag bit: this rank has no request queued or pending
_STALL_ABORT = "__stall_abort__"
_IDLE_WAIT_CAP = 0.005  # seconds: longest sleep between idle rounds
_ALL_IDLE_WAIT_CAP = 0.05  # seconds: the same while the last round found every rank idle


class Engine:
    """Owns the communicators and the background thread of one ``init()``."""

    def __init__(self, config: Config, world: MPICommunicator) -> None:
        self.config = config
        self.rank = world.rank
        self.size = world.size
        # Separate communicators keep negotiation messages apart from data messages.
        self.control = _control_communicator(world.dup(), config.negotiation)
        data = world.dup().with_algorithm(*_data_algorithms())
        self.counter = ByteCounter()  # payload bytes sent, counted by the data communicators
        self.process_sets: dict[int, ProcessSetState] = {
            WORLD: ProcessSetState(WORLD, tuple(range(self.size)), data, self.counter)
        }
        self._next_set_id = 1
        self.coordinator = Coordinator(self.size)
        self.cache = ResponseCache(config.cache_capacity, self.rank)
        self.timeline = _open_timeline(config.timeline, self.rank)
        self.mark_cycles = config.timeline_mark_cycles
        self.executor = Executor(self.rank, config.fusion_threshold, self.timeline,
                                 self.process_sets, {
                                     Kind.ADD_PROCESS_SET: self._add_process_set,
                                     Kind.REMOVE_PROCESS_SET: self._remove_process_set,
                                     Kind.SET_TUNABLES: self._apply_tunables,
                                 })
        self._tunable_requests = itertools.count()
        self.stall = StallInspector(config.stall_warning_seconds,
                                    config.stall_shutdown_seconds, self.rank)
        self._cond = threading.Condition()
        self._queue: list[Request] = []
        self._in_flight: set[str] = set()
        self._queued_bytes = 0  # dense all-reduce bytes in the queue
        # Queued bytes that end batching at once (from the all-reduce's cost model, known
        # after the first all-reduce); None: batching ends on a quiet queue only.
        self._bucket_bytes: int | None = None
        self._bucket_awaited = algorithm_name_from_env() in ("auto", "fastest")
        self._pending: dict[str, Request] = {}  # engine thread only, submission order
        self._shutdown_requested = False
        self._user_blocked = False
        self._stall_abort = False
        self._error: DLCommError | None = None
        self._idle_wait = config.cycle_time / 1000.0
        self._all_idle = False  # the last round found no rank with work
        self.rounds = 0  # negotiation rounds run so far
        self._thread = threading.Thread(target=self._run, name="dlcomm-engine", daemon=True)
        self._thread.start()

    # --- user thread ---------------------------------------------------------------------
    def submit(self, request: Request) -> Handle:
        """Queue a request; raise if the name is already in flight or the engine stopped."""
        with self._cond:
            if self._error is not None:
                raise type(self._error)(str(self._error))
            if request.name in self._in_flight:
                raise ValueError(
                    f"a request named '{request.name}' is already in flight on this rank; "
                    "wait for it (synchronize) or use a different name"
                )
            self._in_flight.add(request.name)
            request.handle.on_wait = self._user_waiting
            request.handle.on_done = functools.partial(self._release, request.name)
            # Before the append: once queued, the engine thread may end this phase.
            self.timeline.begin(request.name, "queued", {"kind": request.kind.value})
            self._queue.append(request)
            self._queued_bytes += _dense_bytes(request)
            if len(self._queue) == 1:
                self._cond.notify()
        return request.handle

    def submit_many(self, requests: list[Request]) -> list[Handle]:
        """Queue several requests at once (one lock, one wake-up of the engine thread): a
        backward pass's ready gradients, each with its own name and handle. Raises, queueing
        none of them, if a name is in flight or repeated, or the engine stopped."""
        with self._cond:
            if self._error is not None:
                raise type(self._error)(str(self._error))
            names = [r.name for r in requests]
            if len(set(names)) != len(names):
                seen: set[str] = set()
                for name in names:
                    if name in seen:
                        raise ValueError(f"the name '{name}' appears twice in one batch; "
                                         "give every tensor its own name")
                    seen.add(name)
            busy = self._in_flight.intersection(names)
            if busy:
                raise ValueError(
                    f"a request named '{sorted(busy)[0]}' is already in flight on this rank; "
                    "wait for it (synchronize) or use a different name")
            self._in_flight.update(names)
            for request in requests:
                request.handle.on_wait = self._user_waiting
                request.handle.on_done = functools.partial(self._release, request.name)
                self.timeline.begin(request.name, "queued", {"kind": request.kind.value})
            was_empty = not self._queue
            self._queue.extend(requests)
            self._queued_bytes += sum(_dense_bytes(r) for r in requests)
            if was_empty and requests:
                self._cond.notify()
        return [r.handle for r in requests]

    def _release(self, name: str) -> None:
        """A request completed: its name may be submitted again at once."""
        with self._cond:
            self._in_flight.discard(name)

    def _user_waiting(self) -> None:
        """A user thread blocks on a result: batching further cannot help it."""
        with self._cond:
            self._user_blocked = True
            self._cond.notify()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Tell every rank this one is leaving, then stop the thread."""
        with self._cond:
            self._shutdown_requested = True
            self._cond.notify()
        self._thread.join(timeout)
        self.timeline.close()
        self.executor.buffers.release()

    def set_timeline(self, path: str | None, mark_cycles: bool) -> None:
        """Write the timeline to ``path`` from now on (None: stop); the previous one is
        closed. Phases in progress end in the timeline they began in, or not at all."""
        new = open_timeline(path, self.rank, started_late=True)
        old, self.timeline = self.timeline, new
        self.executor.state.timeline = new
        self.mark_cycles = mark_cycles
        old.close()

    def set_tunables(self, fusion_threshold: int, cycle_time: float) -> None:
        """Change the fusion threshold (bytes) and cycle time (ms); collective on all ranks.

        The change is a negotiated request, so it takes effect at the same point of the
        global order everywhere (fusion groups must agree); ranks that ask for different
        values get a MismatchError.
        """
        name = f"set_tunables.{next(self._tunable_requests)}"
        sig = Signature(Kind.SET_TUNABLES, WORLD, extra=(int(fusion_threshold),
                                                         float(cycle_time)))
        self.submit(Request(name, sig)).wait()

    def _apply_tunables(self, resp: Response, req: Request | None) -> None:
        threshold, cycle = resp.reference.extra
        self.config = dataclasses.replace(self.config, fusion_threshold=threshold,
                                          cycle_time=cycle)
        self.executor.fusion_threshold = threshold
        if self._bucket_bytes is not None:  # the bucket is capped by the threshold
            self._bucket_bytes = self._bucket_from_cost_model()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def error(self) -> DLCommError | None:
        """The error the engine stopped with (None while it runs)."""
        return self._error

    @property
    def bytes_sent(self) -> int:
        return self.counter.total

    # --- engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._cycle():
                pass
        except PeerLostError as exc:  # only an elastic job's TCP communicator raises it
            # Close the mesh at once: peers blocked on this rank fail now, not at a timeout.
            self.control.free()
            self._stop(PeerLostError(f"rank {self.rank} lost a peer: {exc}"))
        except BaseException as exc:  # never die silently: fail every waiting request
            log.exception("dlcomm engine on rank %d failed", self.rank)
            self._stop(DLCommError(f"dlcomm's engine on rank {self.rank} failed: {exc!r}"))

    def _collect(self) -> None:
        """Wait for work (or one idle cycle), batch a burst, move it to ``_pending``."""
        cycle = self.config.cycle_time / 1000.0
        with self._cond:
            if not self._queue and not self._shutdown_requested:
                self._cond.wait(self._idle_wait)
            if self._queue:
                # Let a burst of submissions (a loop of async calls, a backward pass)
                # finish, so it is negotiated and fused together.
                # A full bucket goes at once: its gradients reach the wire while backward
                # still produces the next ones.
                quiet = max(cycle / 4, 5e-5)
                deadline = time.monotonic() + 10 * cycle
                bucket = self._bucket_bytes
                while not self._user_blocked and time.monotonic() < deadline:
                    if bucket is not None and self._queued_bytes >= bucket:
                        break
                    seen = len(self._queue)
                    self._cond.wait(quiet)
                    if len(self._queue) == seen:
                        break
            batch, self._queue = self._queue, []
            self._queued_bytes = 0
            self._user_blocked = False
        for req in batch:
            self._pending[req.name] = req
            self.timeline.end(req.name, "queued")
            self.timeline.begin(req.name, "negotiate")
        cap = max(_ALL_IDLE_WAIT_CAP if self._all_idle else _IDLE_WAIT_CAP, cycle)
        self._idle_wait = cycle if batch else min(self._idle_wait * 2, cap)

    def _cycle(self) -> bool:
        self._collect()
        if self.mark_cycles and self._pending:
            self.timeline.instant("CYCLE_START")
        now = time.monotonic()
        words = np.zeros(self.cache.num_words(), dtype=np.uint64)
        need_full = self._shutdown_requested or self._stall_abort
        bits = []
        for req in self._pending.values():
            if req.announced:
                continue
            bit = None
            if req.kind in CACHEABLE and not self.stall.should_announce(now - req.submitted_at):
                bit = self.cache.lookup(req.name, self.rank, req.signature)
            if bit is None:
                need_full = True
            else:
                bits.append(bit)
        ResponseCache.set_bits(words, bits)
        self.cache.mark_outsider_bits(words)
        if not need_full:
            words[0] |= _NO_UNCACHED
        if not self._pending and not need_full:
            words[0] |= _IDLE
        wait_polling(self.control.iallreduce_band(words).test)
        self.rounds += 1
        self._all_idle = bool(words[0] & _IDLE)

        if not (words[0] & _NO_UNCACHED) or self.coordinator.has_partial():
            responses = self._full_round(now)
        else:
            responses = []
            for bit in self.cache.ready_bits(words):
                self.cache.touch(bit)
                responses.append(self.cache.response(bit))
        if responses:
            self.executor.run(responses, self._pending)
            self._retire(responses)
            if self._bucket_awaited:
                self._bucket_bytes = self._bucket_from_cost_model()
                self._bucket_awaited = self._bucket_bytes is None
        if self.coordinator.stall_abort_ranks:
            self._stop(StallError(self.stall.abort_message(self.coordinator)))
            return False
        if self.coordinator.shutdown_ranks:
            ranks = sorted(set(self.coordinator.shutdown_ranks))
            self._stop(ShutdownError(f"rank(s) {ranks} called shutdown() (or exited) while "
                                     "this request was pending"), quiet=True)
            return False
        if self.stall.check(self.coordinator, now):
            self._stall_abort = True
        return True

    def _full_round(self, now: float) -> list[Response]:
        announcements: list[tuple[str, Signature]] = []
        for req in self._pending.values():
            if not req.announced:
                req.announced = True
                announcements.append((req.name, req.signature))
        if self._stall_abort:
            announcements.append((_STALL_ABORT, Signature(Kind.BARRIER, WORLD)))
        if self._shutdown_requested:
            announcements.append(("__shutdown__", Signature(Kind.SHUTDOWN, WORLD)))
        blobs = self.control.allgather_bytes(dumps(announcements))
        for rank, blob in enumerate(blobs):
            self.coordinator.add(rank, loads(blob), now)
        responses = self.coordinator.pop_ready()
        for resp in responses:
            self.cache.put(resp)
        return responses

    def _retire(self, responses: list[Response]) -> None:
        for resp in responses:
            req = self._pending.get(resp.name)
            if req is not None and req.handle.done():
                del self._pending[resp.name]

    def _stop(self, error: DLCommError, quiet: bool = False) -> None:
        with self._cond:
            self._error = error if self._error is None else self._error
            pending = list(self._pending.values()) + self._queue
            self._queue = []
            self._in_flight.clear()
        self._pending.clear()
        for req in pending:
            if not req.handle.done():
                req.handle.set_error(type(error)(f"'{req.name}': {error}"))
        if pending and not quiet:
            log.error("%s", error)

    def _bucket_from_cost_model(self) -> int | None:
        """``fusion.bucket_bytes`` of the algorithm the cost model picks for a full fusion
        buffer, once ``auto``/``fastest`` measured it; None until then (or never, with a
        fixed algorithm). A local decision: it changes when a rank negotiates, never what
        the ranks agree on."""
        model = built_model(self.process_sets[WORLD].comm)
        if model is None:
            return None
        threshold = self.config.fusion_threshold
        cost = model.cost(model.choose(max(threshold, 1)))
        return bucket_bytes(cost.alpha, cost.beta, threshold)

    # --- process sets (run on every rank, in the global order) --------------------------------
    def _add_process_set(self, resp: Response, req: Request | None) -> int:
        ranks = tuple(resp.reference.extra)
        world = self.process_sets[WORLD].comm
        comm = world.split(0 if self.rank in ranks else None, self.rank)
        set_id = self._next_set_id
        self._next_set_id += 1
        self.process_sets[set_id] = ProcessSetState(set_id, ranks, comm, self.counter)
        self.coordinator.members[set_id] = ranks
        return set_id

    def _remove_process_set(self, resp: Response, req: Request | None) -> None:
        set_id = resp.reference.extra
        state = self.process_sets.pop(set_id)
        self.coordinator.members.pop(set_id, None)
        state.free()


def _dense_bytes(request: Request) -> int:
    """Bytes a request adds to a dense all-reduce bucket (0 for anything else)."""
    if request.kind is not Kind.ALLREDUCE or request.signature.compression != "none":
        return 0
    return sum(a.nbytes for a in request.arrays)


def _control_communicator(control: Any, negotiation: str) -> Any:
    """What the negotiation runs on (``DLCOMM_NEGOTIATION``): ``control`` itself (MPI), or
    ``control`` over a TCP mesh, whose waits sleep in the kernel. MPI's waits are tests
    between sleeps, and each test takes CPU from the ranks being waited for where they share
    cores: ``auto`` picks the mesh where such ranks span several hosts. Collective."""
    if not isinstance(control, MPICommunicator) or control.size < 2 or negotiation == "mpi":
        return control  # an elastic job's control communicator is a TCP mesh already
    if negotiation == "tcp" and mesh_setting() == "off":
        raise ValueError("DLCOMM_NEGOTIATION=tcp negotiates over the TCP mesh, which "
                         "DLCOMM_TCP_MESH=off turns off: set one of them differently")
    if negotiation == "auto" and not crowded_across_hosts(control):
        return control
    return mesh_communicator(control) or control  # a mesh that cannot connect: MPI


def _data_algorithms() -> tuple[Any, Any, Any]:
    """The dlcomm.collectives all-reduce chosen by DLCOMM_ALLREDUCE_ALGORITHM, the
    reduce-scatter that reduces like it and the all-gather that goes where it sends its
    bytes (None: MPI's own)."""
    name = algorithm_name_from_env()
    if name == "mpi":
        return None, None, None
    return get_allreduce_algorithm(name), REDUCE_SCATTERS.get(name), ALLGATHERS.get(name)


def _open_timeline(path: str, rank: int) -> Any:
    if path and "{rank}" not in path and rank != 0:
        path = ""  # without '{rank}' in the path only rank 0 writes, as in Horovod
    return open_timeline(path or None, rank)
