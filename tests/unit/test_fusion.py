"""Fusion planning and pack/unpack, including hypothesis round trips over shapes and dtypes."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.engine.fusion import FusionBuffer, pack, plan_fusion, unpack

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8]


def test_plan_groups_by_key_in_order():
    groups = plan_fusion([4, 4, 4, 4], ["a", "b", "a", "b"], threshold=100)
    assert groups == [[0, 2], [1, 3]]


def test_plan_respects_threshold_and_lets_big_tensors_travel_alone():
    groups = plan_fusion([6, 6, 20, 3], ["k"] * 4, threshold=12)
    assert groups == [[0, 1], [2], [3]]
    assert all(sum([6, 6, 20, 3][i] for i in g) <= 12 or len(g) == 1 for g in groups)


def test_plan_zero_threshold_disables_fusion():
    assert plan_fusion([1, 1, 1], ["k"] * 3, threshold=0) == [[0], [1], [2]]


def test_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="same length"):
        plan_fusion([1], [], 10)
    with pytest.raises(ValueError, match=">= 0"):
        plan_fusion([1], ["k"], -1)


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=3), min_size=1,
                    max_size=8),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_pack_unpack_round_trip(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    arrays = [np.asarray((rng.standard_normal(tuple(s)) * 10).astype(dtype)) for s in shapes]
    buffers = FusionBuffer()
    buf = buffers.get(dtype, sum(a.size for a in arrays))
    offsets = pack(arrays, buf)
    outs = [np.empty_like(a) for a in arrays]
    unpack(buf, outs, offsets)
    for a, o in zip(arrays, outs):
        assert o.shape == a.shape and o.dtype == a.dtype
        np.testing.assert_array_equal(o, a)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=6),
       pre=st.sampled_from([1.0, 0.5, 2.0]), post=st.sampled_from([1.0, 0.25, 3.0]))
def test_pack_unpack_applies_scales(sizes, pre, post):
    arrays = [np.arange(n, dtype=np.float64) for n in sizes]
    buf = FusionBuffer().get(np.float64, sum(sizes))
    offsets = pack(arrays, buf, [pre] * len(arrays))
    outs = [np.empty_like(a) for a in arrays]
    unpack(buf, outs, offsets, [post] * len(arrays))
    for a, o in zip(arrays, outs):
        np.testing.assert_allclose(o, a * pre * post)


def test_fusion_buffer_reuses_memory():
    fb = FusionBuffer()
    a = fb.get(np.float32, 100)
    b = fb.get(np.float32, 50)
    assert np.shares_memory(a, b)
    c = fb.get(np.float32, 1000)
    assert c.size == 1000


def test_bucket_bytes_amortise_the_start_up_cost_within_bounds() -> None:
    from dlcomm.engine.fusion import MIN_BUCKET_BYTES, bucket_bytes

    # 1 ms start-up, 1 GB/s: 9 MB keep the start-up at 10% of the message's time.
    assert bucket_bytes(1e-3, 1e-9, 64 << 20) == 9_000_000
    assert bucket_bytes(1e-3, 1e-9, 64 << 20, startup_share=0.5) == 1_000_000
    assert bucket_bytes(1e-3, 1e-9, 4 << 20) == 4 << 20  # never above the fusion threshold
    assert bucket_bytes(1e-9, 1e-9, 64 << 20) == MIN_BUCKET_BYTES
    assert bucket_bytes(1e-3, 0.0, 64 << 20) == 64 << 20  # free bytes: the whole buffer
    with pytest.raises(ValueError, match=">= 0"):
        bucket_bytes(-1.0, 1e-9, 1 << 20)
    with pytest.raises(ValueError, match="startup_share"):
        bucket_bytes(1e-3, 1e-9, 1 << 20, startup_share=1.0)
