"""Waiting for a non-blocking MPI operation without holding a core.

Open MPI's blocking calls busy-poll. When ranks outnumber cores (the emulated cluster, or a
rank whose peers are still computing), a waiting rank that spins takes CPU from the ranks it
is waiting for. Polling ``test()`` with a short spin and then growing sleeps leaves the CPU to
them, at a cost of at most ``SLEEP_CAP`` of extra latency.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

SPIN_S = 5e-5  # seconds spent re-testing (yielding the GIL) before sleeping
SLEEP_CAP = 2e-4  # seconds: longest sleep between tests
SLEEP_SLACK_NS = 1000  # timer slack while sleeping between tests (Linux's default: 50 us)

_PR_SET_TIMERSLACK = 29
_PR_GET_TIMERSLACK = 30


def wait_polling(test: Callable[[], bool]) -> None:
    """Return once ``test()`` is true (it must drive the operation's progress, as
    ``MPI_Test`` does), sleeping between tests so waiting leaves the CPU free."""
    spin_until = time.perf_counter() + SPIN_S
    while not test():
        if time.perf_counter() < spin_until:
            # Yield the core and the GIL, stay runnable: peers usually arrive soon. (Not
            # ``time.sleep(0)``: that is a timed sleep, which the timer slack stretches to
            # about 50 us, and spinning would stop being spinning.)
            os.sched_yield()
            continue
        delay = 1e-5
        with _fine_timer_slack():
            while not test():
                time.sleep(delay)
                delay = min(delay * 2, SLEEP_CAP)
        return


@contextlib.contextmanager
def _fine_timer_slack() -> Iterator[None]:
    """Sleep about as long as asked in this block: Linux lets a sleep of 10 us last 50 us
    longer (the thread's timer slack), which would make every short wait at least 60 us.
    The thread's own slack is restored afterwards (where ``prctl`` exists)."""
    prctl = _prctl()
    old = -1 if prctl is None else prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    if old <= 0:  # no prctl, or it failed: sleep with the slack the thread has
        yield
        return
    prctl(_PR_SET_TIMERSLACK, SLEEP_SLACK_NS, 0, 0, 0)
    try:
        yield
    finally:
        prctl(_PR_SET_TIMERSLACK, old, 0, 0, 0)


@functools.cache
def _prctl() -> Any:
    """libc's ``prctl`` (Linux), or None where there is none."""
    if os.uname().sysname != "Linux":
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    return fn
