"""Hierarchical top-k (``htopk``) in one process: registry, arguments, shards, the one-rank
case. Several hosts are tested on real ranks: tests/multirank/test_compression_htopk.py."""
from __future__ import annotations

import numpy as np
import pytest

from dlcomm.compression import (
    HOST,
    PEER,
    ErrorFeedback,
    HierarchicalTopK,
    SelfComm,
    compressed_allreduce,
    get_compressor,
)
from dlcomm.compression.htopk import shard_bounds, shard_topk
from dlcomm.compression.topology import host_groups


def test_registry_builds_htopk_with_error_feedback() -> None:
    c = get_compressor("htopk:ratio=0.05")
    assert isinstance(c, ErrorFeedback) and isinstance(c.inner, HierarchicalTopK)
    assert c.inner.ratio == 0.05 and c.describe() == "htopk:ratio=0.05,approx=0"
    assert get_compressor("htopk:ratio=0.05,approx=1").describe() == "htopk:ratio=0.05,approx=1"
    assert c.groups == (HOST, HOST, PEER, HOST) and not c.summable
    assert not isinstance(get_compressor("htopk:ef=0"), ErrorFeedback)


@pytest.mark.parametrize("spec,match", [
    ("htopk:ratio=0", r"\(0, 1\]"), ("htopk:ratio=1.5", r"\(0, 1\]"),
    ("htopk:k=5", r"valid parameters: \['approx', 'ef', 'mc', 'ratio', 'start_iter'\]"),
    ("htopk:ratio=x", "not float"),
    ("htopk+fp16", "does not compose"), ("htopk+bf16", "does not compose"),
])
def test_bad_htopk_specs_raise_value_error(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_compressor(spec)


def test_bad_host_layouts_raise_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        host_groups(SelfComm(), -1)
    monkeypatch.setenv("DLCOMM_HIERARCHICAL_RANKS_PER_HOST", "two")
    with pytest.raises(ValueError, match="DLCOMM_HIERARCHICAL_RANKS_PER_HOST"):
        host_groups(SelfComm())

    class TwoRanks:  # an ExchangeComm that cannot split
        size, rank = 2, 0

    monkeypatch.delenv("DLCOMM_HIERARCHICAL_RANKS_PER_HOST")
    with pytest.raises(ValueError, match="cannot split"):
        host_groups(TwoRanks())


def test_shards_cover_the_tensor_and_differ_by_one_at_most() -> None:
    for n in (0, 1, 3, 7, 63, 64):
        for shards in (1, 2, 3, 5):
            b = shard_bounds(n, shards)
            sizes = np.diff(b)
            assert b[0] == 0 and b[-1] == n and sizes.min() >= 0 and np.ptp(sizes) <= 1
    x = np.arange(10, dtype=np.float32) * np.array([1, -1] * 5, np.float32)
    picked = shard_topk(x, 0.4, 3)  # shards [0,3) [3,6) [6,10): 1, 1 and 1 kept
    assert [p.tolist() for p in picked] == [[2], [5], [9]]
    assert [p.size for p in shard_topk(x[:1], 0.5, 3)] == [0, 0, 1]


def test_approximate_shard_selection_keeps_about_k_of_the_largest() -> None:
    x = np.random.default_rng(1).standard_normal(30001).astype(np.float32)
    for exact, approx in zip(shard_topk(x, 0.01, 3), shard_topk(x, 0.01, 3, approx=True)):
        k = exact.size  # 100 per shard
        assert 0.75 * k <= approx.size <= 1.25 * k
        assert np.all(np.diff(approx) > 0)  # sorted, no repeats
        # a threshold set: everything kept is at least as large as anything dropped
        lo, hi = exact.min() // 10000 * 10000, exact.max() // 10000 * 10000 + 10000
        dropped = np.setdiff1d(np.arange(lo, hi), approx)
        assert np.abs(x[approx]).min() >= np.abs(x[dropped]).max()


def test_without_the_driver_htopk_asks_for_the_topology() -> None:
    c = HierarchicalTopK(0.5)
    payloads, ctx = c.compress(np.ones((4, 4), np.float32), "w")
    with pytest.raises(ValueError, match="host topology"):
        c.resume(payloads, ctx)


@pytest.mark.parametrize("approx", [0, 1])
def test_one_rank_is_plain_topk_with_the_same_bits(approx: int) -> None:
    """One host of one rank: the host sum is the tensor and there is one shard (the
    approximate selection too: the same threshold search as ``topk:approx=1``)."""
    h = get_compressor(f"htopk:ratio=0.1,approx={approx}", min_compress_size=0)
    t = get_compressor(f"topk:ratio=0.1,approx={approx}", min_compress_size=0)
    rng = np.random.default_rng(3)
    for _ in range(4):
        x = rng.standard_normal((130, 70)).astype(np.float32)
        a = compressed_allreduce(h, x, "w", SelfComm())
        b = compressed_allreduce(t, x, "w", SelfComm())
        assert np.array_equal(a, b)
        assert np.array_equal(h.residual("w"), t.residual("w"))


def test_momentum_correction_and_checkpoints_work_as_for_every_compressor() -> None:
    c = get_compressor("htopk:ratio=0.2", min_compress_size=0)
    c.set_momentum(0.9)
    x = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
    for _ in range(2):
        compressed_allreduce(c, x, "w", SelfComm())
    sent = c.residual("w") == 0
    assert np.all(c.velocity("w")[sent] == 0) and np.all(c.velocity("w")[~sent] != 0)
    state = c.state_dict()
    again = get_compressor("htopk:ratio=0.2", min_compress_size=0)
    again.load_state_dict(state)
    assert np.array_equal(compressed_allreduce(c, x, "w", SelfComm()),
                          compressed_allreduce(again, x, "w", SelfComm()))


def test_reduce_scatter_without_a_transport_all_reduces_and_keeps_its_part() -> None:
    from dlcomm.compression.exchange import reduce_scatter_sum

    x = np.arange(5, dtype=np.float32)
    assert np.array_equal(reduce_scatter_sum(SelfComm(), x, [5]), x)
    with pytest.raises(ValueError, match="do not split"):
        reduce_scatter_sum(SelfComm(), x, [4])
