"""The coordinator's table: which named requests every rank has announced.

Each rank keeps an identical copy (every rank applies the same all-gathered announcements in
the same order), so every rank computes the same ready list, in the same global order,
without a second message from a central coordinator. Errors are therefore known, with every
rank's values, on every rank.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterable
from typing import Any

from dlcomm.engine.request import Kind, Signature, mismatch_message

WORLD = 0


@dataclasses.dataclass
class Response:
    """A request that is ready on every rank that must take part, or an error about it."""

    name: str
    kind: Kind
    process_set_id: int
    signatures: dict[int, Signature]  # world rank -> its announcement
    members: tuple[int, ...]  # world ranks of the process set, ascending
    joined: frozenset[int] = frozenset()  # members that joined: contribute zeros
    error: str | None = None
    last_joined: int = -1  # join: the world rank that joined last
    # What the executor derives from the response once (fusion's key and size): responses
    # are cached and run again every step, so it is computed on the first run only.
    derived: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False,
                                                repr=False)

    @functools.cached_property
    def reference(self) -> Signature:
        """The signature of the lowest announcing rank (they agree unless ``error``)."""
        return self.signatures[min(self.signatures)]

    @property
    def contributors(self) -> int:
        return len(self.members) - len(self.joined)


@dataclasses.dataclass
class _Entry:
    name: str
    signatures: dict[int, Signature]
    first_seen: float
    warned: bool = False


class Coordinator:
    """Replicated negotiation state for all process sets of one job."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.members: dict[int, tuple[int, ...]] = {WORLD: tuple(range(world_size))}
        self.table: dict[str, _Entry] = {}  # insertion order is the global order
        self.joined: dict[int, None] = {}  # world ranks, in the order they joined
        self.shutdown_ranks: list[int] = []
        self.stall_abort_ranks: list[int] = []

    # --- input ---------------------------------------------------------------------------
    def add(self, rank: int, announcements: Iterable[tuple[str, Signature]],
            now: float | None = None) -> None:
        """Record what ``rank`` announced this round (apply ranks in ascending order)."""
        now = time.monotonic() if now is None else now
        for name, sig in announcements:
            if sig.kind is Kind.SHUTDOWN:
                self.shutdown_ranks.append(rank)
            elif name == "__stall_abort__":
                self.stall_abort_ranks.append(rank)
            else:
                entry = self.table.get(name)
                if entry is None:
                    entry = self.table[name] = _Entry(name, {}, now)
                entry.signatures[rank] = sig
                if sig.kind is Kind.JOIN:
                    self.joined[rank] = None

    def has_partial(self) -> bool:
        """True while some announced request waits for other ranks (or a rank has joined)."""
        return bool(self.table) or bool(self.joined)

    # --- output --------------------------------------------------------------------------
    def pop_ready(self) -> list[Response]:
        """Remove and return ready requests and errors, in the global order."""
        ready: list[Response] = []
        for name in list(self.table):
            entry = self.table[name]
            response = self._resolve(entry)
            if response is not None:
                del self.table[name]
                ready.append(response)
                if response.kind is Kind.JOIN and response.error is None:
                    self.joined.clear()
        return ready

    def _resolve(self, entry: _Entry) -> Response | None:
        sig = next(iter(entry.signatures.values()))
        members = self.members.get(sig.process_set_id)
        if members is None:
            return self._error(entry, sig, (), f"process set {sig.process_set_id} does not "
                               "exist (it was never added, or was removed)")
        outsiders = sorted(set(entry.signatures) - set(members))
        if outsiders:
            return self._error(entry, sig, members,
                               f"ranks {outsiders} submitted '{entry.name}' to process set "
                               f"{sig.process_set_id}, which they are not members of "
                               f"(members: {list(members)})")
        joined = frozenset(r for r in self.joined if r in members)
        if sig.kind is Kind.JOIN:
            if len(self.joined) < self.world_size:
                return None
            return Response(entry.name, sig.kind, sig.process_set_id, entry.signatures,
                            members, joined, last_joined=list(self.joined)[-1])
        if joined:
            # A joined rank stays joined until every rank has joined, so a request it cannot
            # serve fails at once, without waiting for the other ranks' announcements: their
            # unnamed calls may be numbered differently (a rank that joined earlier made
            # fewer calls), and waiting for the same name would never end.
            message = self._joined_conflict(entry.name, sig, joined)
            if message is not None:
                return self._error(entry, sig, members, message)
        waiting_for = [r for r in members if r not in entry.signatures and r not in joined]
        if waiting_for:
            return None
        message = mismatch_message(entry.name, entry.signatures)
        if message is not None:
            return self._error(entry, sig, members, message)
        return Response(entry.name, sig.kind, sig.process_set_id, entry.signatures, members,
                        joined if sig.kind is Kind.ALLREDUCE else frozenset())

    @staticmethod
    def _joined_conflict(name: str, sig: Signature, joined: frozenset[int]) -> str | None:
        if sig.kind is Kind.ALLREDUCE and sig.op in ("sum", "average"):
            if sig.compression == "none":
                return None
            return (f"'{name}': compressed all-reduce ({sig.compression}) cannot run while "
                    f"ranks {sorted(joined)} have joined; use compression 'none' with join()")
        what = f"{sig.kind.value} with op {sig.op}" if sig.op else sig.kind.value
        return (f"'{name}': {what} cannot run while ranks {sorted(joined)} have joined; "
                "after join() only Sum and Average all-reduces are served")

    @staticmethod
    def _error(entry: _Entry, sig: Signature, members: tuple[int, ...], msg: str) -> Response:
        return Response(entry.name, sig.kind, sig.process_set_id, entry.signatures, members,
                        error=msg)

    # --- stalls --------------------------------------------------------------------------
    def stalled(self, now: float, after: float) -> list[tuple[str, list[int], float]]:
        """Requests waiting longer than ``after`` seconds: (name, missing ranks, age)."""
        out = []
        for entry in self.table.values():
            age = now - entry.first_seen
            if age < after:
                continue
            sig = next(iter(entry.signatures.values()))
            members = self.members.get(sig.process_set_id, ())
            missing = [r for r in members if r not in entry.signatures and r not in self.joined]
            if sig.kind is Kind.JOIN:
                missing = [r for r in range(self.world_size) if r not in self.joined]
            out.append((entry.name, missing, age))
        return out
