"""``allgather_batch`` and ``sendrecv_batch``: the arrays of one round packed into one message
give what one message per array gives, on fake communicators holding the other ranks'
contributions; a rank that sends other arrays is named."""
from __future__ import annotations

import numpy as np
import pytest

from dlcomm.compression.exchange import allgather_batch, sendrecv_batch


class RecordingComm:
    """Rank ``rank`` of ``size``: ``allgather`` returns the arrays every rank contributed
    (``others[q]`` for rank q, this rank's own argument for itself) and counts the calls."""

    def __init__(self, rank: int, others: list) -> None:
        self.rank, self.size, self.others, self.calls = rank, len(others), others, 0

    def allgather(self, arr: np.ndarray) -> list:
        self.calls += 1
        return [arr.copy() if q == self.rank else self.others[q] for q in range(self.size)]


def _arrays(rank: int) -> list[np.ndarray]:
    """Uneven sizes per rank (none a multiple of 8 bytes), mixed dtypes, one empty."""
    rng = np.random.default_rng(rank)
    return [rng.standard_normal(3 + rank).astype(np.float32),
            rng.integers(0, 1000, 5 + 2 * rank).astype(np.int32),
            np.empty(0, dtype=np.float64),
            rng.standard_normal(1 + rank).astype(np.float16)]


def _packed_of(arrays: list, rank: int, size: int) -> np.ndarray:
    """The buffer rank ``rank`` sends for ``arrays`` (captured from its own call)."""
    class Capture:
        def __init__(self) -> None:
            self.rank, self.size = rank, size

        def allgather(self, arr: np.ndarray) -> list:
            self.sent = arr.copy()
            return [arr] * size  # a well-formed reply; only what was sent is kept

    capture = Capture()
    allgather_batch(capture, arrays)
    return capture.sent


@pytest.mark.parametrize("size", [2, 3, 4, 5])
def test_one_allgather_gives_each_array_of_each_rank(size):
    sent = [_packed_of(_arrays(q), q, size) for q in range(size)]
    for rank in range(size):
        comm = RecordingComm(rank, sent)
        got = allgather_batch(comm, _arrays(rank))
        assert comm.calls == 1
        for j in range(4):
            assert len(got[j]) == size
            for q in range(size):
                want = _arrays(q)[j]
                assert got[j][q].dtype == want.dtype and np.array_equal(got[j][q], want)


def test_a_rank_with_other_arrays_is_reported():
    size = 3
    sent = [_packed_of(_arrays(q), q, size) for q in range(size)]
    fewer = list(sent)
    fewer[1] = _packed_of(_arrays(1)[:3], 1, size)  # rank 1 sends one array fewer
    with pytest.raises(ValueError, match="rank 1 sent others"):
        allgather_batch(RecordingComm(0, fewer), _arrays(0))
    retyped = list(sent)  # rank 2 sends float64 where the others send float32
    retyped[2] = _packed_of([a.astype(np.float64) if a.dtype == np.float32 else a
                             for a in _arrays(2)], 2, size)
    with pytest.raises(ValueError, match="rank 2 sent others"):
        allgather_batch(RecordingComm(0, retyped), _arrays(0))


def test_one_array_and_none_skip_the_packing():
    comm = RecordingComm(0, [np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32)])
    assert allgather_batch(comm, []) == [] and comm.calls == 0
    got = allgather_batch(comm, [np.arange(3, dtype=np.int32)])
    assert comm.calls == 1 and [list(g) for g in got[0]] == [[0, 1, 2], [0, 1]]


class PairComm:
    """Rank ``rank`` whose partner answers ``sendrecv`` with the buffer ``reply``."""

    def __init__(self, rank: int, reply: np.ndarray) -> None:
        self.rank, self.size, self.reply, self.calls = rank, 2, reply, 0

    def sendrecv(self, arr: np.ndarray, peer: int) -> np.ndarray:
        self.calls += 1
        return self.reply


def test_one_send_receive_carries_every_array_and_checks_them():
    theirs = _arrays(1)
    got = sendrecv_batch(PairComm(0, _packed_of(theirs, 1, 2)), _arrays(0), 1)
    assert [g.dtype for g in got] == [a.dtype for a in theirs]
    assert all(np.array_equal(g, a) for g, a in zip(got, theirs))
    comm = PairComm(0, _packed_of(theirs[:2], 1, 2))
    with pytest.raises(ValueError, match=r"batched send-receive: this rank \(rank 0\).*rank 1"):
        sendrecv_batch(comm, _arrays(0), 1)
    assert comm.calls == 1
