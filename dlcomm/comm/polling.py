"""Waiting for a non-blocking MPI operation without holding a core.

Open MPI's blocking calls busy-poll. When ranks outnumber cores (the emulated cluster, or a
rank whose peers are still computing), a waiting rank that spins takes CPU from the ranks it
is waiting for. Polling ``test()`` with a short spin and then growing sleeps leaves the CPU to
them, at a cost of at most ``SLEEP_CAP`` of extra latency.
"""
from __future__ import annotations

import time
from collections.abc import Callable

SPIN_S = 5e-5  # seconds spent re-testing (yielding the GIL) before sleeping
SLEEP_CAP = 2e-4  # seconds: longest sleep between tests


def wait_polling(test: Callable[[], bool]) -> None:
    """Return once ``test()`` is true (it must drive the operation's progress, as
    ``MPI_Test`` does), sleeping between tests so waiting leaves the CPU free."""
    spin_until = time.perf_counter() + SPIN_S
    while not test():
        if time.perf_counter() < spin_until:
            time.sleep(0)  # yield the GIL, stay runnable: peers usually arrive soon
            continue
        delay = 1e-5
        while not test():
            time.sleep(delay)
            delay = min(delay * 2, SLEEP_CAP)
        return
