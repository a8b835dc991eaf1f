"""Per-tensor timeline of the engine's phases, written as Chrome trace event JSON.

The engine marks when each tensor enters and leaves a phase (queued, negotiate, fuse,
compress, communicate, decompress, unpack). Each tensor gets its own labelled row
(``tid``) in the rank's process (``pid`` = rank), so Perfetto / chrome://tracing show
where a step's time went. Events are buffered in memory and written every
``FLUSH_EVERY_EVENTS`` events or ``FLUSH_EVERY_SECONDS`` seconds, with no extra thread;
the file is valid JSON after ``close()`` and, if the process dies first, still loads in
Perfetto (the array format tolerates the missing ``]``).
"""
from __future__ import annotations

import atexit
import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

PHASES = ("queued", "negotiate", "fuse", "compress", "communicate", "decompress", "unpack")

FLUSH_EVERY_EVENTS = 1024
FLUSH_EVERY_SECONDS = 1.0
MARKER_TID = 0  # row for instant events (cycle markers); tensors get rows 1, 2, ...
_NOTHING = nullcontext()  # what a disabled timeline's phase() returns (reusable)


def _plain(value: object) -> object:
    """JSON stand-in for an arg JSON cannot encode: a numpy scalar's value, else its str()."""
    try:
        return value.item()  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return str(value)


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_plain)


def _now_ns() -> int:
    """Nanoseconds on the system-wide monotonic clock (shared by ranks on one host)."""
    return time.monotonic_ns()


def _check_name(value: object, what: str) -> None:
    """Raise unless ``value`` is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} must be a non-empty string, got {value!r}")


def _check_args(args: object) -> None:
    """Raise unless ``args`` is None or a dict (extra fields shown with the event)."""
    if args is not None and not isinstance(args, dict):
        raise TypeError(f"args must be a dict or None, got {type(args).__name__}")


class Timeline:
    """Records phase begin/end per tensor for one rank into a Chrome trace JSON file.

    ``'{rank}'`` in ``path`` is replaced by ``rank``. Phases outside ``PHASES`` are
    allowed (they get their own colour), but the engine should stick to ``PHASES``.
    Thread-safe: the user thread marks "queued", the engine thread everything else.
    Calls after ``close()`` are ignored, so a late event during shutdown cannot fail.
    """

    enabled = True

    def __init__(self, path: str, rank: int, started_late: bool = False) -> None:
        """``started_late``: opened while the engine runs (``start_timeline``), so a phase
        that began before it may end here; such ends are ignored."""
        _check_name(path, "timeline path")
        self._started_late = started_late
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ValueError(f"rank must be a non-negative integer, got {rank!r}")
        self.path = path.replace("{rank}", str(rank))
        self.rank = rank
        try:
            self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise ValueError(
                f"cannot write the timeline to {self.path!r}: {exc.strerror or exc}; "
                "set DLCOMM_TIMELINE to a writable file path"
            ) from exc
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self._wrote_any = False
        self._closed = False
        self._tids: dict[str, int] = {}
        self._open: dict[tuple[str, str], list[tuple[int, dict | None]]] = {}
        self._last_flush = time.monotonic()
        self._file.write("[\n")
        self._pending += [
            {"name": "process_name", "ph": "M", "pid": rank, "tid": MARKER_TID,
             "args": {"name": f"rank {rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": MARKER_TID,
             "args": {"sort_index": rank}},
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": MARKER_TID,
             "args": {"name": "(markers)"}},
        ]
        self._flush_locked()
        atexit.register(self.close)

    def _tid_locked(self, tensor_name: str) -> int:
        """The row of ``tensor_name``, labelling a new row on first use."""
        tid = self._tids.get(tensor_name)
        if tid is None:
            tid = self._tids[tensor_name] = len(self._tids) + 1
            self._pending.append(
                {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                 "args": {"name": tensor_name}}
            )
        return tid

    def begin(self, tensor_name: str, phase: str, args: dict | None = None) -> None:
        """Mark that ``tensor_name`` entered ``phase`` now (``args`` are shown with it)."""
        _check_name(tensor_name, "tensor_name")
        _check_name(phase, "phase")
        _check_args(args)
        now = _now_ns()
        with self._lock:
            if self._closed:
                return
            self._tid_locked(tensor_name)
            stack = self._open.setdefault((tensor_name, phase), [])
            stack.append((now, dict(args) if args else None))

    def end(self, tensor_name: str, phase: str) -> None:
        """Mark that ``tensor_name`` left ``phase`` now; raises if it never began it."""
        _check_name(tensor_name, "tensor_name")
        _check_name(phase, "phase")
        now = _now_ns()
        with self._lock:
            if self._closed:
                return
            stack = self._open.get((tensor_name, phase))
            if not stack:
                if self._started_late:
                    return
                raise ValueError(
                    f"timeline end({tensor_name!r}, {phase!r}) without a matching begin()"
                )
            start, args = stack.pop()
            self._complete_locked(tensor_name, phase, start, now, args)

    @contextmanager
    def phase(self, tensor_names: str | Sequence[str], phase: str,
              args: dict | None = None) -> Iterator[None]:
        """Record the ``with`` block as ``phase`` of each tensor in ``tensor_names`` (one name
        or several, e.g. the members of a fusion group)."""
        names = [tensor_names] if isinstance(tensor_names, str) else list(tensor_names)
        for name in names:
            self.begin(name, phase, args)
        try:
            yield
        finally:
            for name in names:
                self.end(name, phase)

    def instant(self, name: str, args: dict | None = None) -> None:
        """Record a point event, e.g. a cycle marker, on the rank's marker row."""
        _check_name(name, "name")
        _check_args(args)
        now = _now_ns()
        with self._lock:
            if self._closed:
                return
            event = {"name": name, "ph": "i", "s": "t", "ts": now / 1000, "pid": self.rank,
                     "tid": MARKER_TID}
            if args:
                event["args"] = dict(args)
            self._append_locked(event)

    def close(self) -> None:
        """Write phases still open (marked unfinished), the buffer and the closing ``]``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            now = _now_ns()
            for (tensor_name, phase), stack in self._open.items():
                for start, args in stack:
                    args = {**(args or {}), "unfinished": True}
                    self._complete_locked(tensor_name, phase, start, now, args)
            self._open.clear()
            self._flush_locked()
            self._file.write("\n]\n")
            self._file.close()
        atexit.unregister(self.close)

    def __enter__(self) -> Timeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _complete_locked(
        self, tensor_name: str, phase: str, start: int, stop: int, args: dict | None
    ) -> None:
        """Buffer one complete ("X") event for a finished phase (times in microseconds)."""
        event = {"name": phase, "cat": phase, "ph": "X", "ts": start / 1000,
                 "dur": max(0, stop - start) / 1000, "pid": self.rank,
                 "tid": self._tid_locked(tensor_name)}
        if args:
            event["args"] = args
        self._append_locked(event)

    def _append_locked(self, event: dict[str, Any]) -> None:
        """Buffer ``event``; write the buffer when it is big or old enough."""
        self._pending.append(event)
        if (len(self._pending) >= FLUSH_EVERY_EVENTS
                or time.monotonic() - self._last_flush >= FLUSH_EVERY_SECONDS):
            self._flush_locked()

    def _flush_locked(self) -> None:
        """Write buffered events, comma-separated, so the array stays well formed."""
        if self._pending:
            # One encode call per batch is cheaper than one per event; a batch is one line.
            text = _ENCODER.encode(self._pending)[1:-1]
            self._file.write((",\n" if self._wrote_any else "") + text)
            self._wrote_any = True
            self._pending.clear()
            self._file.flush()
        self._last_flush = time.monotonic()


class NullTimeline:
    """A disabled timeline: the same methods as ``Timeline``, doing nothing."""

    enabled = False
    path = None

    def begin(self, tensor_name: str, phase: str, args: dict | None = None) -> None:
        """Do nothing (the timeline is off)."""

    def end(self, tensor_name: str, phase: str) -> None:
        """Do nothing (the timeline is off)."""

    def phase(self, tensor_names: str | Sequence[str], phase: str,
              args: dict | None = None) -> AbstractContextManager:
        """A ``with`` block that records nothing (the timeline is off)."""
        return _NOTHING

    def instant(self, name: str, args: dict | None = None) -> None:
        """Do nothing (the timeline is off)."""

    def close(self) -> None:
        """Do nothing (the timeline is off)."""

    def __enter__(self) -> NullTimeline:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def open_timeline(path: str | None, rank: int,
                  started_late: bool = False) -> Timeline | NullTimeline:
    """The timeline for ``rank``: a ``Timeline`` when ``path`` is set, else a no-op.

    Without ``'{rank}'`` in ``path`` only rank 0 records (ranks would overwrite one file);
    use e.g. ``/tmp/tl.{rank}.json`` for one file per rank.
    """
    if path is not None and not isinstance(path, str):
        raise TypeError(f"timeline path must be a string or None, got {type(path).__name__}")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError(f"rank must be a non-negative integer, got {rank!r}")
    if not path or ("{rank}" not in path and rank != 0):
        return NullTimeline()
    return Timeline(path, rank, started_late)
