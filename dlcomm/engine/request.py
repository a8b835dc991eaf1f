"""Requests the user thread hands to the engine, their handles, and what ranks must agree on.

A request's ``Signature`` is announced to every rank during negotiation; ``mismatch_message``
compares the signatures of all ranks and names each rank's value when they disagree.
"""
from __future__ import annotations

import dataclasses
import enum
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from dlcomm.errors import DLCommError
from dlcomm.ops import ReduceOp


class Kind(str, enum.Enum):
    """Which collective a request asks for."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    BARRIER = "barrier"
    JOIN = "join"
    ADD_PROCESS_SET = "add_process_set"
    REMOVE_PROCESS_SET = "remove_process_set"
    SET_TUNABLES = "set_tunables"
    SHUTDOWN = "shutdown"


# Kinds whose responses may be remembered by the response cache (same name, same
# signature each step: gradients in steady-state training).
CACHEABLE = frozenset({Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST, Kind.ALLTOALL,
                       Kind.REDUCESCATTER})


class Signature(NamedTuple):
    """What one rank says about a named request. Hashable, cheap to build and to pickle
    (a NamedTuple: requests are built on the hot path of every gradient)."""

    kind: Kind
    process_set_id: int
    dtype: str = ""
    shapes: tuple[tuple[int, ...], ...] = ()
    op: str = ""
    root: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    compression: str = "none"
    splits: tuple[int, ...] | None = None  # alltoall: rows sent to each rank
    extra: Any = None  # add_process_set: the ranks; set_tunables: the values
    device: bool = False  # True for device (CuPy) arrays, moved by NCCL

    def agreed_fields(self) -> dict[str, Any]:
        """Fields every rank must give equal values for (per-rank sizes excluded)."""
        fields = {
            "kind": self.kind.value,
            "process set": self.process_set_id,
            "dtype": self.dtype,
            "op": self.op,
            "root": self.root,
            "prescale_factor": self.prescale,
            "postscale_factor": self.postscale,
            "compression": self.compression,
            "arguments": self.extra,
            "device": "gpu" if self.device else "host",
        }
        if self.kind in (Kind.ALLGATHER, Kind.ALLTOALL):
            # The first dimension may differ per rank; the rest must agree.
            fields["number of tensors"] = len(self.shapes)
            fields["shape[1:]"] = tuple(s[1:] for s in self.shapes)
        else:
            fields["shape"] = self.shapes if len(self.shapes) != 1 else self.shapes[0]
        return fields


def mismatch_message(name: str, sigs: dict[int, Signature]) -> str | None:
    """Describe how ranks disagree about ``name``, or ``None`` when they agree."""
    kinds = {r: s.kind.value for r, s in sorted(sigs.items())}
    if len(set(kinds.values())) > 1:  # other fields are not comparable across kinds
        listed = ", ".join(f"rank {r}: {k}" for r, k in kinds.items())
        return f"ranks submitted tensor '{name}' with mismatched arguments: kind differs ({listed})"
    per_rank = {r: s.agreed_fields() for r, s in sorted(sigs.items())}
    fields = list(dict.fromkeys(k for f in per_rank.values() for k in f))  # union, in order
    problems = []
    for field in fields:
        values = {r: f.get(field, "-") for r, f in per_rank.items()}
        if len(set(map(repr, values.values()))) > 1:
            listed = ", ".join(f"rank {r}: {v}" for r, v in values.items())
            problems.append(f"{field} differs ({listed})")
    if not problems:
        return None
    return f"ranks submitted tensor '{name}' with mismatched arguments: " + "; ".join(problems)


class Handle:
    """Completion of an asynchronous request: ``poll()`` / ``synchronize()`` take these."""

    __slots__ = ("_done", "_error", "_lock", "_result", "name", "on_done", "on_wait")

    def __init__(self, name: str) -> None:
        self.name = name
        # A lock held until completion: lighter than threading.Event (one per gradient).
        self._lock = threading.Lock()
        self._lock.acquire()
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        # Called when a thread starts waiting: the engine then stops batching and runs.
        self.on_wait: Any = None
        # Called on completion, before waiters wake: frees the name for reuse.
        self.on_done: Any = None

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Any) -> None:
        self._result = result
        self._complete()

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._complete()

    def _complete(self) -> None:
        if self.on_done is not None:
            self.on_done()
            self.on_done = None
        self._done = True
        self._lock.release()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done; return the result or raise the request's error."""
        if not self._done:
            if self.on_wait is not None:
                self.on_wait()
            deadline = None if timeout is None else time.monotonic() + timeout
            # Waiting in short slices keeps Ctrl-C responsive in the main thread.
            while not self._lock.acquire(timeout=0.1):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"request '{self.name}' did not finish in {timeout}s")
            self._lock.release()  # let other waiters through
        if self._error is not None:
            if isinstance(self._error, DLCommError):
                raise type(self._error)(str(self._error))
            raise self._error
        return self._result

    def __call__(self) -> Any:
        """Wait and return the result: a handle may be called like the function that
        Horovod's ``sparse_allreduce_async`` returns."""
        return self.wait()

    def then(self, fn: Callable[[Any], Any]) -> Handle:
        """A handle on ``fn(result)``: ``fn`` runs once, in the first thread that waits for it
        after this request completed; the request's error passes through unchanged. The
        adapters turn core arrays back into framework tensors this way."""
        return _Then(self, fn)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<dlcomm.Handle '{self.name}' {state}>"


class _Then(Handle):
    """``source.then(fn)``: done with ``source``; waiting applies ``fn`` to its result once."""

    __slots__ = ("_fn", "_source")

    def __init__(self, source: Handle, fn: Callable[[Any], Any]) -> None:
        super().__init__(source.name)
        self._lock.release()  # here the lock only serialises the one call of fn
        self._source = source
        self._fn = fn

    def done(self) -> bool:
        return self._source.done()

    def set_result(self, result: Any) -> None:
        raise TypeError("a handle made by then() completes with the handle it follows")

    set_error = set_result

    def wait(self, timeout: float | None = None) -> Any:
        result = self._source.wait(timeout)
        with self._lock:
            if not self._done:
                self._result = self._fn(result)
                self._done = True
                self._fn = None  # drop what the conversion captured (tensors, contexts)
        return self._result


@dataclasses.dataclass(eq=False)
class Request:
    """One named collective submitted by the user thread."""

    name: str
    signature: Signature
    arrays: list[Any] = dataclasses.field(default_factory=list)  # inputs
    outputs: list[Any] = dataclasses.field(default_factory=list)  # in-place targets, if any
    handle: Handle = dataclasses.field(default=None)  # type: ignore[assignment]
    submitted_at: float = dataclasses.field(default_factory=time.monotonic)
    announced: bool = False
    grouped: bool = False  # grouped_allreduce: the result is a list of arrays
    compressor: Any = None  # a dlcomm.compression.Compressor, when signature.compression set

    def __post_init__(self) -> None:
        if self.handle is None:
            self.handle = Handle(self.name)

    @property
    def kind(self) -> Kind:
        return self.signature.kind

    @property
    def op(self) -> ReduceOp | None:
        return ReduceOp(self.signature.op) if self.signature.op else None
