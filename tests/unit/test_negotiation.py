"""The replicated coordinator and the response cache, without MPI."""
import numpy as np

from dlcomm.engine.negotiation import Coordinator
from dlcomm.engine.request import Kind, Signature
from dlcomm.engine.response_cache import ResponseCache


def sig(shape=(3,), dtype="<f4", op="sum", kind=Kind.ALLREDUCE, ps=0, root=-1):
    return Signature(kind, ps, dtype, (shape,), op, root)


def test_ready_only_when_every_rank_announced_in_first_seen_order():
    c = Coordinator(3)
    c.add(0, [("b", sig()), ("a", sig())])
    c.add(1, [("a", sig())])
    assert c.pop_ready() == []
    c.add(1, [("b", sig())])
    c.add(2, [("a", sig()), ("b", sig())])
    assert [r.name for r in c.pop_ready()] == ["b", "a"]
    assert not c.has_partial()


def test_mismatch_names_every_rank_value():
    c = Coordinator(3)
    c.add(0, [("w", sig(shape=(3,)))])
    c.add(1, [("w", sig(shape=(4,)))])
    c.add(2, [("w", sig(shape=(3,), dtype="<f8"))])
    (resp,) = c.pop_ready()
    assert "'w'" in resp.error
    assert "rank 0: (3,), rank 1: (4,), rank 2: (3,)" in resp.error
    assert "dtype differs (rank 0: <f4, rank 1: <f4, rank 2: <f8)" in resp.error


def test_allgather_allows_different_first_dimension():
    c = Coordinator(2)
    c.add(0, [("g", sig(shape=(2, 5), kind=Kind.ALLGATHER, op=""))])
    c.add(1, [("g", sig(shape=(7, 5), kind=Kind.ALLGATHER, op=""))])
    (resp,) = c.pop_ready()
    assert resp.error is None
    c.add(0, [("h", sig(shape=(2, 5), kind=Kind.ALLGATHER, op=""))])
    c.add(1, [("h", sig(shape=(2, 6), kind=Kind.ALLGATHER, op=""))])
    assert "shape[1:] differs" in c.pop_ready()[0].error


def test_process_set_members_only():
    c = Coordinator(4)
    c.members[1] = (1, 3)
    c.add(1, [("p", sig(ps=1))])
    c.add(3, [("p", sig(ps=1))])
    (resp,) = c.pop_ready()
    assert resp.error is None and resp.members == (1, 3)
    c.add(0, [("q", sig(ps=1))])
    assert "not members" in c.pop_ready()[0].error


def test_joined_ranks_contribute_zeros_to_sum_only():
    c = Coordinator(3)
    c.add(2, [("join.noname.0", Signature(Kind.JOIN, 0))])
    c.add(0, [("a", sig())])
    c.add(1, [("a", sig())])
    (resp,) = c.pop_ready()
    assert resp.error is None and resp.joined == {2} and resp.contributors == 2
    c.add(0, [("m", sig(op="min"))])
    c.add(1, [("m", sig(op="min"))])
    assert "cannot run while ranks [2] have joined" in c.pop_ready()[0].error
    c.add(0, [("join.noname.0", Signature(Kind.JOIN, 0))])
    c.add(1, [("join.noname.0", Signature(Kind.JOIN, 0))])
    (j,) = c.pop_ready()
    assert j.kind is Kind.JOIN and j.last_joined == 1
    assert not c.has_partial()


def test_request_a_joined_rank_cannot_serve_fails_without_waiting_for_the_others():
    """Two ranks whose unnamed calls are numbered differently (the one that joined earlier
    made fewer calls) each fail on their own announcement instead of waiting forever."""
    c = Coordinator(3)
    c.add(1, [("join.noname.0", Signature(Kind.JOIN, 0))])
    c.add(0, [("allgather.noname.0", sig(kind=Kind.ALLGATHER, op=""))])
    c.add(2, [("allgather.noname.1", sig(kind=Kind.ALLGATHER, op=""))])
    errors = c.pop_ready()
    assert [r.name for r in errors] == ["allgather.noname.0", "allgather.noname.1"]
    assert all("cannot run while ranks [1] have joined" in r.error for r in errors)
    c.add(0, [("bc", sig(kind=Kind.BROADCAST, op="", root=0))])
    assert "broadcast cannot run while ranks [1] have joined" in c.pop_ready()[0].error
    c.add(0, [("a", sig())])  # Sum waits for rank 2, the joined rank adds zeros
    assert c.pop_ready() == []
    c.add(2, [("a", sig())])
    (resp,) = c.pop_ready()
    assert resp.error is None and resp.joined == {1}


def test_stalled_lists_missing_ranks():
    c = Coordinator(3)
    c.add(0, [("s", sig())], now=0.0)
    c.add(2, [("s", sig())], now=1.0)
    assert c.stalled(now=10.0, after=5.0) == [("s", [1], 10.0)]
    assert c.stalled(now=3.0, after=5.0) == []


def _ready(name, c=None):
    c = c or Coordinator(2)
    for r in range(2):
        c.add(r, [(name, sig())])
    return c.pop_ready()[0]


def test_cache_hits_only_same_signature_and_reports_bits():
    cache = ResponseCache(capacity=2, rank=0)
    cache.put(_ready("a"))
    bit = cache.lookup("a", 0, sig())
    assert bit is not None
    assert cache.lookup("a", 0, sig(shape=(4,))) is None
    words = np.zeros(cache.num_words(), dtype=np.uint64)
    ResponseCache.set_bit(words, bit)
    assert cache.ready_bits(words) == [bit]
    assert cache.response(bit).name == "a"


def test_cache_evicts_least_recently_used():
    cache = ResponseCache(capacity=2, rank=0)
    for n in "abc":
        cache.put(_ready(n))
    assert cache.lookup("a", 0, sig()) is None
    assert cache.lookup("c", 0, sig()) is not None
    assert len(cache) == 2


def test_cache_marks_bits_of_sets_this_rank_is_outside():
    c = Coordinator(3)
    c.members[1] = (1, 2)
    c.add(1, [("p", sig(ps=1))])
    c.add(2, [("p", sig(ps=1))])
    resp = c.pop_ready()[0]
    cache = ResponseCache(capacity=4, rank=0)
    cache.put(resp)
    words = np.zeros(cache.num_words(), dtype=np.uint64)
    cache.mark_outsider_bits(words)
    assert cache.ready_bits(words) == [0]
