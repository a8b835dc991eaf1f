"""The one ``Handle``: completion, errors, and ``then`` (how the adapters convert results)."""
import threading

import pytest

from dlcomm.engine.request import Handle
from dlcomm.errors import MismatchError
from dlcomm.mpi_ops import poll, synchronize


def test_then_applies_fn_once_after_completion():
    h = Handle("t")
    calls = []
    chained = h.then(lambda r: calls.append(r) or r * 2)
    assert isinstance(chained, Handle) and chained.name == "t"
    assert not chained.done() and not poll(chained)
    h.set_result(21)
    assert chained.done() and poll(chained)
    assert synchronize(chained) == 42 and chained.wait() == 42
    assert calls == [21]  # the conversion ran once, whoever waited
    assert h.wait() == 21  # the source keeps its own result
    assert chained.then(lambda r: r + 1).wait() == 43  # chains compose


def test_then_passes_the_request_error_and_never_calls_fn():
    h = Handle("bad")
    chained = h.then(lambda r: pytest.fail("fn must not run on an error"))
    h.set_error(MismatchError("ranks disagree"))
    assert chained.done()
    for _ in range(2):
        with pytest.raises(MismatchError, match="ranks disagree"):
            chained.wait()


def test_then_waits_in_another_thread_and_times_out():
    h = Handle("late")
    chained = h.then(str)
    with pytest.raises(TimeoutError, match="late"):
        chained.wait(timeout=0.05)
    results = []
    waiter = threading.Thread(target=lambda: results.append(chained.wait()))
    waiter.start()
    h.set_result(7)
    waiter.join(timeout=10)
    assert results == ["7"]


def test_a_chained_handle_is_not_completed_by_hand():
    chained = Handle("x").then(lambda r: r)
    with pytest.raises(TypeError, match="then"):
        chained.set_result(1)
    with pytest.raises(TypeError, match="then"):
        chained.set_error(RuntimeError("no"))
    assert "pending" in repr(chained)
