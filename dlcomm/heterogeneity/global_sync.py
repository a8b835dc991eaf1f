"""Global synchronisation points of a local-averaging algorithm (DS-Sync), checked collective.

DS-Sync averages parameters within small groups, so ranks hold different models between
global averages. Where the model is read as *the* model (evaluation, a checkpoint, the end
of the script) every rank must average over all ranks at the same step. Those points are
reached by user code, and a script that evaluates on rank 0 only would make rank 0 wait
for a global average the others never join, while they wait for rank 0 in their groups:
a hang. So each point is announced: a rank reaching one sends every other rank a small
message with its step count, and waits for the same announcement from all of them before
averaging. A rank that receives an announcement for a step it has already passed (it went
on training), or whose own announced step another rank has passed, knows the ranks
disagree; it raises ``MismatchError`` and forwards the message, so every rank raises the
same error instead of hanging: the waiting rank polls for it, the others find it at their
next step or while they wait for their group.

The average itself runs on a communicator of its own (a duplicate of dlcomm's), with the
``ordered`` all-reduce, so it needs neither the engine (it also works after
``dlcomm.shutdown()``, at interpreter exit) nor MPI's choice of summation order: every rank
ends with the same bits.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlcomm.comm.polling import wait_polling
from dlcomm.errors import MismatchError
from dlcomm.heterogeneity.world_comm import base_comm

_TAG = 17  # the only tag on the private communicator

# What a rank can read the model for; named in the error.
READ_POINTS = "model.eval(), a state_dict(), synchronize_globally() or the end of the script"


class GlobalSyncPoints:
    """The announced global averages of one optimizer (collective construction: every rank
    builds it in the same order relative to other collectives on ``comm``)."""

    def __init__(self, what: str, comm: Any = None) -> None:
        base = base_comm(comm)
        self.comm = base.dup()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.what = what
        self._announced: dict[int, list[int]] = {}  # rank -> steps it announced, unmatched
        self._sends: list[Any] = []
        self.error: str | None = None  # set once the ranks disagreed: every later call raises

    # --- messages ---------------------------------------------------------------------------
    def _send_all(self, message: tuple) -> None:
        self._sends = [r for r in self._sends if not r.test()]
        for dest in range(self.size):
            if dest != self.rank:
                self._sends.append(self.comm.isend_object(message, dest, _TAG))

    def _receive(self) -> None:
        """Take every message that has arrived; raise if one was a forwarded error."""
        while (message := self.comm.poll_object(_TAG)) is not None:
            source, (kind, value) = message
            if kind == "step":
                self._announced.setdefault(source, []).append(int(value))
            elif self.error is None:  # "error": a rank found a mismatch or is leaving
                self.error = str(value)
        if self.error is not None:
            raise MismatchError(self.error)

    def _fail(self, message: str) -> None:
        """Tell every rank, then raise here (once)."""
        if self.error is None:
            self.error = message
            self._send_all(("error", message))
        raise MismatchError(self.error)

    # --- the checks -------------------------------------------------------------------------
    def _passed(self, source: int, step: int) -> str:
        """The error when rank ``source`` averaged after ``step`` and other ranks went on
        (the same text whichever rank finds it, so every rank reports the same error)."""
        return (f"{self.what}: rank {source} averaged the model over all ranks after step "
                f"{step} ({READ_POINTS}), but other ranks went on training without doing so. "
                "Every rank must reach these points at the same step: evaluate and "
                "checkpoint on every rank, or call optimizer.synchronize_globally() on every "
                "rank before a rank-0-only block")

    def _raise_if_passed(self, steps_done: int) -> None:
        """Fail if another rank averaged after a step this rank has completed and left."""
        for source, steps in sorted(self._announced.items()):
            passed = [s for s in steps if s <= steps_done]
            if passed:
                self._fail(self._passed(source, min(passed)))

    def check(self, steps_done: int) -> None:
        """Between steps (and while waiting for a group): raise ``MismatchError`` on a rank
        that has done ``steps_done`` steps if another rank averaged globally after one of
        them, i.e. this rank went past a point the other stopped at."""
        if self.error is not None:
            raise MismatchError(self.error)
        self._receive()
        self._raise_if_passed(steps_done)

    def synchronize(self, steps_done: int, groups: Sequence[Sequence[np.ndarray]]) -> None:
        """Average ``groups`` (lists of numpy arrays, one dtype per list) over every rank, in
        place, once every rank has announced the same ``steps_done``."""
        self.check(steps_done - 1)  # nobody averaged at a step this rank went past
        self._send_all(("step", steps_done))

        def everyone_here() -> bool:
            self._receive()
            self._raise_if_passed(steps_done - 1)
            if any(s > steps_done for steps in self._announced.values() for s in steps):
                self._fail(self._passed(self.rank, steps_done))  # they went past this point
            return all(steps_done in self._announced.get(r, ()) for r in range(self.size)
                       if r != self.rank)

        wait_polling(everyone_here)
        for r in range(self.size):
            if r != self.rank:
                self._announced[r].remove(steps_done)
        for arrays in groups:
            _average(self.comm, list(arrays))

    def leave(self, reason: str) -> None:
        """This rank will take part in no more global averages (it is exiting with an
        error): ranks waiting for it raise ``reason`` instead of waiting forever."""
        if self.error is None:
            self.error = reason
            self._send_all(("error", reason))

    def waiting_check(self, steps_done: int) -> Callable[[], None]:
        """``check`` bound to a step, for a wait loop."""
        return lambda: self.check(steps_done)


def _average(comm: Any, arrays: list[np.ndarray]) -> None:
    """Average same-dtype ``arrays`` over ``comm`` in place (float16 summed in float32)."""
    if not arrays:
        return
    # The collectives load the transport, whose import starts MPI: dlcomm.init does that.
    from dlcomm.collectives.ordered import ordered_allreduce  # noqa: PLC0415 - MPI start-up

    dtype = arrays[0].dtype
    work = np.float32 if dtype == np.float16 else dtype
    buf = np.concatenate([a.reshape(-1) for a in arrays]).astype(work, copy=False)
    ordered_allreduce(comm, buf, buf, "sum")
    buf /= comm.size
    pos = 0
    for a in arrays:
        a[...] = buf[pos:pos + a.size].reshape(a.shape)
        pos += a.size
