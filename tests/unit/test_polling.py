"""``wait_polling``: it spins by yielding (never a timed sleep, which the timer slack turns into
50 us or more), then sleeps with a fine timer slack, and leaves the thread's slack as it
found it."""
from __future__ import annotations

import time

import pytest

from dlcomm.comm import polling


class Countdown:
    """A ``test()`` that turns true on its ``n``-th call, recording the thread's timer slack
    at each call (None where prctl is unavailable)."""

    def __init__(self, n: int) -> None:
        self.left, self.slack = n, []

    def __call__(self) -> bool:
        prctl = polling._prctl()
        self.slack.append(None if prctl is None else prctl(polling._PR_GET_TIMERSLACK,
                                                          0, 0, 0, 0))
        self.left -= 1
        return self.left <= 0


def test_returns_once_the_test_is_true() -> None:
    for n in (1, 2, 30):
        test = Countdown(n)
        polling.wait_polling(test)
        assert test.left == 0 and len(test.slack) == n


def test_the_spin_yields_and_never_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    yields: list[None] = []
    monkeypatch.setattr(polling, "SPIN_S", 60.0)  # every wait here ends inside the spin
    monkeypatch.setattr(polling.time, "sleep", sleeps.append)
    monkeypatch.setattr(polling.os, "sched_yield", lambda: yields.append(None))
    polling.wait_polling(Countdown(25))
    assert sleeps == [] and len(yields) == 24


def test_the_sleeps_grow_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(polling, "SPIN_S", 0.0)
    monkeypatch.setattr(polling.time, "sleep", sleeps.append)
    polling.wait_polling(Countdown(12))
    assert sleeps[0] == pytest.approx(1e-5)
    assert all(b >= a for a, b in zip(sleeps, sleeps[1:]))
    assert max(sleeps) == polling.SLEEP_CAP


@pytest.mark.skipif(polling._prctl() is None, reason="prctl (Linux) is not available here")
def test_sleeps_run_with_a_fine_slack_and_restore_the_thread_slack(
        monkeypatch: pytest.MonkeyPatch) -> None:
    prctl = polling._prctl()
    before = prctl(polling._PR_GET_TIMERSLACK, 0, 0, 0, 0)
    monkeypatch.setattr(polling, "SPIN_S", 0.0)
    test = Countdown(4)
    polling.wait_polling(test)
    # The first test runs before any sleep; the others between sleeps, with the fine slack.
    assert test.slack[0] == before
    assert test.slack[1:] == [polling.SLEEP_SLACK_NS] * 3
    assert prctl(polling._PR_GET_TIMERSLACK, 0, 0, 0, 0) == before


@pytest.mark.skipif(polling._prctl() is None, reason="prctl (Linux) is not available here")
def test_the_slack_is_restored_when_the_test_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    prctl = polling._prctl()
    before = prctl(polling._PR_GET_TIMERSLACK, 0, 0, 0, 0)
    monkeypatch.setattr(polling, "SPIN_S", 0.0)
    calls = []

    def failing() -> bool:
        calls.append(None)
        if len(calls) == 3:
            raise RuntimeError("transport failed")
        return False

    with pytest.raises(RuntimeError, match="transport failed"):
        polling.wait_polling(failing)
    assert prctl(polling._PR_GET_TIMERSLACK, 0, 0, 0, 0) == before


def test_a_real_wait_ends() -> None:
    """Without monkeypatching: a condition that turns true after a few ms is seen."""
    end = time.monotonic() + 0.003
    polling.wait_polling(lambda: time.monotonic() >= end)
    assert time.monotonic() >= end
