"""The elastic driver's rendezvous: which live workers form each round of the job and at
which ranks, and the small all-gathers they make through the driver while they connect to
each other. Served over a Unix socket (``dlcomm.comm.rendezvous`` is the worker's side).

A round forms when every live worker has asked to join, or, once ``join_timeout_s`` passed
since the first one asked, with those that did (at least ``min_np``); the driver stops the
others (a worker that cannot answer is stuck or cut off). A member that exits breaks its
round: every all-gather of that round then answers "lost", so no worker waits for it.
"""
from __future__ import annotations

import dataclasses
import os
import socketserver
import threading
import time
from collections import defaultdict
from typing import Any

from dlcomm.comm.rendezvous import recv_message, send_message

_POLL_S = 0.5  # how often a held request re-checks (the condition is also notified)


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a worker runs: its host, the host's position in the host list, and its slot."""

    host: str
    host_index: int
    slot: int


class Rendezvous:
    """Rounds of an elastic job (thread-safe: the server's handler threads and the
    driver's loop share it)."""

    def __init__(self, min_np: int, join_timeout_s: float) -> None:
        if min_np < 1:
            raise ValueError(f"min_np must be >= 1, got {min_np}")
        if join_timeout_s <= 0:
            raise ValueError(f"join_timeout_s must be > 0, got {join_timeout_s}")
        self.min_np, self.join_timeout_s = min_np, join_timeout_s
        self._cond = threading.Condition()
        self.live: dict[str, Place] = {}
        self._waiting: dict[str, float] = {}  # worker -> when it asked to join
        self.round_id = 0
        self.members: list[str] = []
        self._assignments: dict[str, dict[str, Any]] = {}
        self._gathers: dict[int, dict[int, Any]] = defaultdict(dict)
        self._fetched: dict[int, int] = defaultdict(int)
        self.broken: str | None = None  # why the current round cannot go on
        self._update_wanted = False
        self._stopped: dict[str, str] = {}  # worker -> why the driver stopped it
        self.formed_at: list[float] = []  # monotonic time each round formed
        self._cut_off: list[str] = []  # workers blamed for a failed connection, to stop
        self._cut_off_reported = False

    # --- the driver's side -----------------------------------------------------------------
    def add_worker(self, worker: str, place: Place) -> None:
        """A worker was started; once a round runs, the running workers are told to re-form."""
        with self._cond:
            self.live[worker] = place
            if self.round_id:
                self._update_wanted = True
            self._cond.notify_all()

    def remove_worker(self, worker: str, reason: str, failed: bool = True) -> None:
        """A worker exited or was stopped; a round it belongs to is broken unless it
        finished (the job ends: its peers finish too)."""
        with self._cond:
            self.live.pop(worker, None)
            self._waiting.pop(worker, None)
            self._stopped.setdefault(worker, reason)
            if failed and worker in self.members and self.broken is None:
                self.broken = reason
                self._update_wanted = True
            self._cond.notify_all()

    def form_if_ready(self) -> list[str]:
        """Form the next round if it is due; the live workers left out of it (to stop)."""
        with self._cond:
            return self._form_if_ready(time.monotonic())

    def take_cut_off(self) -> list[str]:
        """Workers that could not connect to the rest of their round (once per report)."""
        with self._cond:
            cut_off, self._cut_off = self._cut_off, []
            return cut_off

    def waiting_count(self) -> int:
        """Workers that asked to join the next round."""
        with self._cond:
            return len(self._waiting)

    # --- requests ----------------------------------------------------------------------------
    def handle(self, message: dict[str, Any]) -> Any:
        """The reply to one worker request (``join``, ``gather`` or ``updates``)."""
        worker = message.get("worker", "")
        op = message.get("op")
        with self._cond:
            if worker not in self.live:
                return {"stop": self._stopped.get(worker, f"unknown worker {worker!r}")}
            if op == "join":
                return self._join(worker)
            if op == "gather":
                return self._gather(message["round"], message["sequence"], message["rank"],
                                    message["value"])
            if op == "unreachable":
                if message["round"] == self.round_id and not self._cut_off_reported:
                    self._cut_off_reported = True
                    # Out of the next round at once: its survivors rejoin within
                    # milliseconds, before the driver's loop could stop these.
                    for cut in _cut_off(self.members, message["pairs"]):
                        self.live.pop(cut, None)
                        self._waiting.pop(cut, None)
                        self._stopped[cut] = "could not connect to the other ranks"
                        self._cut_off.append(cut)
                    self._cond.notify_all()
                return True
            if op == "updates":
                return (message["round"] != self.round_id or self._update_wanted
                        or self.broken is not None)
            return {"stop": f"unknown request {op!r}"}

    def _join(self, worker: str) -> Any:
        joined_after = self.round_id
        self._waiting[worker] = time.monotonic()
        self._form_if_ready(time.monotonic())
        while True:
            if worker not in self.live:
                return {"stop": self._stopped.get(worker, "stopped by the driver")}
            if self.round_id > joined_after and worker in self._assignments:
                return self._assignments[worker]
            self._cond.wait(_POLL_S)

    def _gather(self, round_id: int, sequence: int, rank: int, value: Any) -> Any:
        lost = self._round_lost(round_id)
        if lost:  # before touching the gathers: they belong to the current round
            return lost
        values = self._gathers[sequence]
        values[rank] = value
        while len(values) < len(self.members):
            self._cond.wait(_POLL_S)
            lost = self._round_lost(round_id)
            if lost:
                return lost
        # the lock was held from the last check to here: the round is still this one
        self._cond.notify_all()
        self._fetched[sequence] += 1
        if self._fetched[sequence] == len(self.members):
            del self._gathers[sequence], self._fetched[sequence]
        return [values[r] for r in range(len(self.members))]

    def _round_lost(self, round_id: int) -> dict[str, str] | None:
        """The "lost" reply when round ``round_id`` is broken or replaced, else None."""
        if round_id != self.round_id or self.broken is not None:
            return {"lost": self.broken or f"round {round_id} was replaced"}
        return None

    def _form_if_ready(self, now: float) -> list[str]:
        joining = [w for w in self._waiting if w in self.live]
        if len(joining) < self.min_np:
            return []
        everyone = all(w in self._waiting for w in self.live)
        if not everyone and now - min(self._waiting[w] for w in joining) < self.join_timeout_s:
            return []
        left_out = [w for w in self.live if w not in self._waiting]
        order = sorted(joining, key=lambda w: (self.live[w].host_index, self.live[w].slot))
        self._assign(order)
        self.formed_at.append(now)
        self._waiting.clear()
        self._cond.notify_all()
        return left_out

    def _assign(self, order: list[str]) -> None:
        lost = self.broken is not None
        self.round_id += 1
        self.members = order
        self._gathers.clear()
        self._fetched.clear()
        self.broken = None
        self._update_wanted = False
        self._cut_off_reported = False
        by_host: dict[str, list[str]] = defaultdict(list)
        for worker in order:
            by_host[self.live[worker].host].append(worker)
        local = {w: (workers.index(w), len(workers))
                 for workers in by_host.values() for w in workers}
        by_local: dict[int, list[str]] = defaultdict(list)
        for worker in order:
            by_local[local[worker][0]].append(worker)
        self._assignments = {
            w: {"round_id": self.round_id, "rank": rank, "size": len(order),
                "local_rank": local[w][0], "local_size": local[w][1],
                "cross_rank": by_local[local[w][0]].index(w),
                "cross_size": len(by_local[local[w][0]]), "lost_ranks": lost}
            for rank, w in enumerate(order)
        }


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            message = recv_message(self.request)
        except (ConnectionError, OSError, EOFError):
            return
        reply = self.server.rendezvous.handle(message)  # type: ignore[attr-defined]
        try:
            send_message(self.request, reply)
        except OSError:  # the worker died while it waited
            pass


class RendezvousServer(socketserver.ThreadingUnixStreamServer):
    """Serves ``rendezvous`` on the Unix socket ``path`` from a daemon thread."""

    daemon_threads = True

    def __init__(self, path: str, rendezvous: Rendezvous) -> None:
        super().__init__(path, _Handler)
        os.chmod(path, 0o600)
        self.rendezvous = rendezvous
        self._thread = threading.Thread(target=self.serve_forever, args=(0.2,),
                                        name="dlcomm-rendezvous", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket."""
        self.shutdown()
        self.server_close()
        try:
            os.unlink(self.server_address)  # type: ignore[arg-type]
        except OSError:
            pass


def _cut_off(members: list[str], pairs: list[tuple[int, int]]) -> list[str]:
    """The members to stop after a failed connection attempt: those that failed with the
    most peers (a host whose link is cut fails with all of them); between two ranks alone
    that failed with each other, the later one."""
    partners: dict[int, set[int]] = defaultdict(set)
    for rank, peer in pairs:
        if 0 <= rank < len(members) and 0 <= peer < len(members) and rank != peer:
            partners[rank].add(peer)
            partners[peer].add(rank)
    if not partners:
        return []
    most = max(len(p) for p in partners.values())
    blamed = sorted(r for r, p in partners.items() if len(p) == most)
    if most == 1:  # isolated pairs: nothing says which side is cut; stop the later rank
        blamed = sorted({max(r, next(iter(partners[r]))) for r in blamed})
    return [members[r] for r in blamed]
