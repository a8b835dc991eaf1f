"""Single-process tests of dlcomm.compression against plain numpy references."""
from __future__ import annotations

import numpy as np
import pytest
from compression_reference import (
    ALL_SPECS,
    acpsgd_steps,
    efsign_average,
    gtopk_steps,
    powersgd_step0,
    signum_vote,
    simulate,
    topk_dense,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from dlcomm.compression import (
    QSGD,
    ErrorFeedback,
    PowerSGD,
    RandomK,
    SelfComm,
    TopK,
    available_compressors,
    compressed_allreduce,
    compressor_from_env,
    get_compressor,
)
from dlcomm.compression.topk_select import approx_topk_indices, exact_topk_indices

DTYPES = [np.float16, np.float32, np.float64]


def make(spec: str, **kwargs: object):
    return get_compressor(spec, min_compress_size=0, compress_1d=True, **kwargs)


def grads_for(size: int, shape: tuple, dtype=np.float32, step: int = 0) -> list:
    return [np.random.default_rng([r, step, 7]).standard_normal(shape).astype(dtype)
            for r in range(size)]


# -- round trips -----------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(
    spec=st.sampled_from(ALL_SPECS),
    shape=st.sampled_from([(1,), (7,), (33,), (1, 1), (5, 9), (3, 4, 5), (2, 1, 6)]),
    dtype=st.sampled_from(DTYPES),
)
def test_roundtrip_keeps_shape_and_dtype(spec, shape, dtype):
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    out = simulate([make(spec)], [x], "t")
    assert out.shape == x.shape and out.dtype == x.dtype
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("dtype", DTYPES)
def test_none_is_exact_and_fp16_is_a_cast(dtype):
    x = np.random.default_rng(2).standard_normal((16, 8)).astype(dtype)
    np.testing.assert_array_equal(simulate([make("none")], [x], "t"), x)
    np.testing.assert_array_equal(
        simulate([make("fp16")], [x], "t"), x.astype(np.float16).astype(dtype)
    )


def test_bf16_rounds_like_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = np.concatenate([
        rng.standard_normal(5000).astype(np.float32) * 1e3,
        np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, 3.4e38], np.float32),
        # exact ties between two bfloat16 neighbours (round half to even)
        np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)], np.float32),
    ])
    ours = bf16_bits_to_float(float_to_bf16_bits(x))
    theirs = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert np.isnan(bf16_bits_to_float(float_to_bf16_bits(np.array([np.nan], np.float32))))[0]
    out = simulate([make("bf16")], [x[:5000].reshape(50, 100)], "t")
    np.testing.assert_array_equal(out.reshape(-1), theirs[:5000])


# -- top-k -----------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3000), ratio=st.floats(0.001, 1.0), seed=st.integers(0, 1000))
def test_exact_topk_returns_the_k_largest_magnitudes(n, ratio, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    k = max(1, int(ratio * n))
    idx = exact_topk_indices(x, k)
    assert idx.size == k == np.unique(idx).size
    np.testing.assert_array_equal(np.sort(np.abs(x[idx])), np.sort(np.abs(x))[n - k:])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), ratio=st.floats(0.001, 1.0), zeros=st.floats(0.0, 1.0),
       seed=st.integers(0, 1000))
def test_exact_topk_is_exact_when_many_values_are_zero(n, ratio, zeros, seed):
    # Many zeros take the select-among-non-zeros path (fewer non-zeros than k included).
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.random(n) < zeros] = 0.0
    k = max(1, int(ratio * n))
    idx = exact_topk_indices(x, k)
    assert idx.size == k == np.unique(idx).size
    assert np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(np.sort(np.abs(x[idx])), np.sort(np.abs(x))[n - k:])


def test_exact_topk_on_a_structured_gradient_with_zero_rows_and_columns():
    # The shape that made numpy's argpartition 30x slower: whole zero rows and columns.
    g = np.random.default_rng(0).standard_normal((64, 49)).astype(np.float32)
    g[::3] = 0.0
    g[:, :20] = 0.0
    k = 30
    idx = exact_topk_indices(g.ravel(), k)
    np.testing.assert_array_equal(np.sort(np.abs(g.ravel()[idx])),
                                  np.sort(np.abs(g.ravel()))[-k:])


def test_topk_compressor_matches_dense_reference():
    x = np.random.default_rng(4).standard_normal((64, 50)).astype(np.float32)
    out = simulate([TopK(ratio=0.03, min_compress_size=0)], [x], "t")
    np.testing.assert_array_equal(out, topk_dense(x, int(0.03 * x.size)))


def test_approx_topk_is_a_threshold_set_of_about_k():
    x = np.random.default_rng(5).standard_normal(1 << 20).astype(np.float32)
    k = x.size // 100
    idx = approx_topk_indices(x, k, tolerance=0.25)
    assert 0.75 * k <= idx.size <= 1.25 * k
    chosen = np.zeros(x.size, bool)
    chosen[idx] = True
    assert np.abs(x[chosen]).min() >= np.abs(x[~chosen]).max()


def test_approx_topk_with_heavy_ties_caps_the_count():
    x = np.zeros(1 << 18, np.float32)
    x[::3] = 1.0
    idx = approx_topk_indices(x, 1000)
    assert idx.size <= 1250 and np.all(x[idx] == 1.0)


# -- unbiasedness ----------------------------------------------------------------------------
def test_randomk_unbiased_is_unbiased():
    x = np.random.default_rng(6).standard_normal(100)
    c = RandomK(ratio=0.1, seed=3, unbiased=True, min_compress_size=0, compress_1d=True)
    trials = 4000
    mean = np.mean([simulate([c], [x], "v") for _ in range(trials)], axis=0)
    sigma = np.abs(x) * np.sqrt(100 / 10 - 1) / np.sqrt(trials)
    assert np.all(np.abs(mean - x) <= 5 * sigma + 1e-9)


def test_randomk_indices_agree_across_instances_and_vary_by_step():
    x = np.arange(1, 1001, dtype=np.float64)
    a, b = (RandomK(ratio=0.05, min_compress_size=0, compress_1d=True) for _ in range(2))
    pa0, pb0 = a.compress(x, "w")[0][0], b.compress(x, "w")[0][0]
    np.testing.assert_array_equal(pa0, pb0)
    assert not np.array_equal(a.compress(x, "w")[0][0], pa0)


def test_qsgd_is_unbiased_and_on_the_level_grid():
    x = np.random.default_rng(7).standard_normal(64)
    c = QSGD(levels=4, seed=1, norm=2, min_compress_size=0, compress_1d=True)
    trials = 4000
    outs = np.array([simulate([c], [x], "v") for _ in range(trials)])
    unit = np.linalg.norm(x) / 4
    grid = outs / unit
    np.testing.assert_allclose(grid, np.round(grid), atol=1e-9)
    assert np.all(np.abs(outs) <= np.abs(x) + unit + 1e-12)
    sigma = unit / 2 / np.sqrt(trials)
    assert np.all(np.abs(outs.mean(axis=0) - x) <= 5 * sigma)


# -- error feedback --------------------------------------------------------------------------
EF_SPECS = ["topk:ratio=0.05", "topk:ratio=0.05,approx=1", "randomk:ratio=0.1,ef=1",
            "gtopk:ratio=0.05",
            "efsignsgd", "powersgd:rank=2", "acpsgd:rank=2", "powersgd:rank=1+fp16",
            "qsgd:levels=2,ef=1", "signum:ef=1", "bf16:ef=1"]


@pytest.mark.parametrize("spec", EF_SPECS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_error_feedback_conserves(spec, dtype):
    c = make(spec)
    assert isinstance(c, ErrorFeedback)
    old = np.zeros((24, 20), dtype)
    eps = np.finfo(dtype).eps
    for step in range(4):
        g = grads_for(1, (24, 20), dtype, step)[0]
        sent = simulate([c], [g], "w", average=False)  # P = 1: the result is what was sent
        new = c.residual("w")
        scale = np.abs(g + old).max()
        np.testing.assert_allclose(sent + new, g + old, rtol=0, atol=8 * eps * scale)
        old = new.copy()


def test_error_feedback_rejects_a_changed_shape():
    c = make("topk:ratio=0.5")
    c.compress(np.ones((4, 4), np.float32), "w")
    with pytest.raises(ValueError, match="reset_state"):
        c.compress(np.ones((4, 5), np.float32), "w")


# -- low rank --------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,rank", [((8, 5), 5), ((5, 12), 5), ((4, 3, 5), 4), ((6, 6), 9)])
def test_powersgd_full_rank_reconstructs_exactly(shape, rank):
    x = np.random.default_rng(8).standard_normal(shape)
    c = PowerSGD(rank=rank, min_compress_size=0)
    for _ in range(2):  # cold and warm start
        np.testing.assert_allclose(simulate([c], [x], "w"), x, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("size", [1, 3])
def test_powersgd_matches_reference(size):
    grads = grads_for(size, (20, 3, 4), np.float64)
    cs = [make("powersgd:rank=2,ef=0") for _ in range(size)]
    np.testing.assert_allclose(simulate(cs, grads, "w"), powersgd_step0(grads, 2, "w"),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("size", [1, 2])
def test_acpsgd_alternates_like_reference(size):
    steps = [grads_for(size, (16, 12), np.float64, s) for s in range(4)]
    cs = [make("acpsgd:rank=3,ef=0") for _ in range(size)]
    ours = [simulate(cs, grads, "w") for grads in steps]
    for o, ref in zip(ours, acpsgd_steps(steps, 3, "w")):
        np.testing.assert_allclose(o, ref, rtol=1e-9, atol=1e-12)


# -- sign, gtopk -----------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 4])
def test_signum_is_a_majority_vote(size):
    grads = grads_for(size, (10, 17))
    grads[0][0, :3] = 0.0
    out = simulate([make("signum") for _ in range(size)], grads, "w")
    np.testing.assert_array_equal(out, signum_vote(grads))


@pytest.mark.parametrize("size", [1, 3])
def test_efsignsgd_first_step_matches_reference(size):
    grads = grads_for(size, (10, 17), np.float64)
    out = simulate([make("efsignsgd") for _ in range(size)], grads, "w")
    np.testing.assert_allclose(out, efsign_average(grads), rtol=1e-12)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_gtopk_matches_dense_tree_reference(size):
    steps = [grads_for(size, (30, 20), np.float64, s) for s in range(3)]
    cs = [make("gtopk:ratio=0.02") for _ in range(size)]
    refs = gtopk_steps(steps, 0.02)
    for grads, ref in zip(steps, refs):
        out = simulate(cs, grads, "w")
        np.testing.assert_array_equal(np.flatnonzero(out), np.flatnonzero(ref))
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


# -- bypass ----------------------------------------------------------------------------------
def test_small_and_1d_tensors_bypass_compression():
    c = get_compressor("topk:ratio=0.01", min_compress_size=100)
    assert not c.applies_to(np.ones((5, 5), np.float32))
    assert not c.applies_to(np.ones(1000, np.float32))
    assert c.applies_to(np.ones((10, 10), np.float32))
    assert get_compressor("topk", compress_1d=True).applies_to(np.ones(5000, np.float32))
    grads = grads_for(2, (5, 5))
    out = simulate([c, get_compressor("topk:ratio=0.01", min_compress_size=100)], grads, "b")
    np.testing.assert_allclose(out, (grads[0] + grads[1]) / 2, rtol=1e-6)
    assert c.residual("b") is None


# -- registry and validation -----------------------------------------------------------------
def test_registry_builds_every_compressor_with_default_error_feedback():
    needs_ef = {"topk", "gtopk", "htopk", "efsignsgd", "powersgd", "acpsgd"}
    for name in available_compressors():
        assert isinstance(get_compressor(name), ErrorFeedback) == (name in needs_ef), name
    assert get_compressor("randomk").unbiased is False  # neither memory nor n/k (issue 17)
    assert get_compressor("randomk:ef=1").inner.unbiased is False
    assert get_compressor("randomk:unbiased=1").unbiased is True
    c = get_compressor("powersgd:rank=4+fp16")
    assert c.summable and c.inner.cast == "fp16" and c.inner.inner.rank == 4
    assert get_compressor(" TopK : ratio=0.5 , approx=1").inner.approx


@pytest.mark.parametrize("spec,match", [
    ("topk:ratio=0", r"\(0, 1\]"), ("topk:ratio=1.5", r"\(0, 1\]"),
    ("randomk:ratio=-1", r"\(0, 1\]"), ("gtopk:ratio=2", r"\(0, 1\]"),
    ("powersgd:rank=0", ">= 1"), ("acpsgd:rank=-2", ">= 1"), ("qsgd:levels=0", ">= 1"),
    ("zip", "valid names: .*'topk'"), ("", "valid names"),
    ("topk:k=5", r"valid parameters: \['approx', 'ef', 'hierarchical', 'mc', 'ratio', "
                 r"'start_iter'\]"),
    ("topk:ratio", "valid parameters"), ("qsgd:levels=2.5", "not int"),
    ("topk:approx=maybe", "0 or 1"), ("topk+fp8", r"\['fp16', 'bf16'\]"),
    ("powersgd+bf16", "use '\\+fp16'"),
])
def test_bad_specs_raise_value_error_listing_choices(spec, match):
    with pytest.raises(ValueError, match=match):
        get_compressor(spec)


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="dtype int64"):
        make("topk").compress(np.arange(10), "w")
    with pytest.raises(TypeError, match="name"):
        make("none").compress(np.ones(3, np.float32), "")
    with pytest.raises(TypeError, match="numpy.ndarray"):
        make("none").compress([1.0, 2.0], "w")
    with pytest.raises(ValueError, match="min_compress_size"):
        get_compressor("topk", min_compress_size=-1)
    with pytest.raises(ValueError, match="op must be"):
        make("signum").aggregate([np.ones(2)], "max")


def test_bypass_knobs_reach_every_way_of_naming_a_compressor(monkeypatch):
    # The knobs' environment variables apply wherever a compressor is built from a spec
    # (get_compressor, Compression.lookup, DistributedOptimizer's compression=None), and an
    # explicit argument wins over them.
    monkeypatch.setenv("DLCOMM_MIN_COMPRESS_SIZE", "10")
    monkeypatch.setenv("DLCOMM_COMPRESS_1D", "1")
    c = get_compressor("topk:ratio=0.5")
    assert c.applies_to(np.ones(12, np.float32)) and not c.applies_to(np.ones(9, np.float32))
    assert not get_compressor("topk", min_compress_size=100).applies_to(np.ones(12, np.float32))
    assert not get_compressor("topk", compress_1d=False).applies_to(np.ones(2000, np.float32))
    from dlcomm.compression.adapter import NoneCompressor, make_compression, resolve
    compression = make_compression(NoneCompressor)
    assert compression.lookup("qsgd").core.applies_to(np.ones(12, np.float32))
    monkeypatch.setenv("DLCOMM_COMPRESSION", "powersgd:rank=1")
    assert resolve(None, compression).core.applies_to(np.ones((3, 4), np.float32))
    monkeypatch.setenv("DLCOMM_MIN_COMPRESS_SIZE", "-1")
    with pytest.raises(ValueError, match="DLCOMM_MIN_COMPRESS_SIZE"):
        get_compressor("topk")


def test_compressor_from_env():
    c = compressor_from_env(env={"DLCOMM_COMPRESSION": "qsgd:levels=8",
                                 "DLCOMM_MIN_COMPRESS_SIZE": "10", "DLCOMM_COMPRESS_1D": "1"})
    assert isinstance(c, QSGD) and c.levels == 8 and c.min_compress_size == 10 and c.compress_1d
    assert compressor_from_env(env={}).name == "none"
    with pytest.raises(ValueError, match="DLCOMM_COMPRESS_1D"):
        compressor_from_env(env={"DLCOMM_COMPRESS_1D": "yes"})
    with pytest.raises(ValueError, match="valid names"):
        compressor_from_env(env={"DLCOMM_COMPRESSION": "nope"})


def test_compressed_allreduce_on_one_rank_and_its_argument_checks():
    x = np.random.default_rng(9).standard_normal((40, 30)).astype(np.float32)
    for spec in ALL_SPECS:
        c, ref = make(spec), make(spec)
        np.testing.assert_array_equal(compressed_allreduce(c, x, "w", SelfComm()),
                                      simulate([ref], [x], "w"))
    with pytest.raises(TypeError, match="Compressor"):
        compressed_allreduce("topk", x, "w", SelfComm())
    with pytest.raises(TypeError, match="comm must provide"):
        compressed_allreduce(make("none"), x, "w", object())


def test_throughput_script_runs_and_reports_every_spec():
    from dlcomm.tools.bench.compression_throughput import (
        format_tables,
        measure_throughput,
        measure_topk,
    )

    rows = measure_throughput(sizes=(2048,), specs=("none", "powersgd:rank=2"), repeats=1)
    assert [r["spec"] for r in rows] == ["memcpy", "none", "powersgd:rank=2"]
    table = format_tables(rows, measure_topk(1 << 12, repeats=1))
    assert "`powersgd:rank=2`" in table and "approx (threshold)" in table
    with pytest.raises(ValueError, match="multiples of 1024"):
        measure_throughput(sizes=(1000,))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2000), ranks=st.integers(1, 5), ratio=st.floats(0.001, 1.0),
       dtype=st.sampled_from(["float16", "float32", "float64"]),
       op=st.sampled_from(["sum", "average"]), seed=st.integers(0, 1000),
       cast=st.sampled_from([None, "fp16"]), approx=st.booleans())
def test_sparse_decompress_all_has_the_bits_of_the_dense_aggregate(
        n: int, ranks: int, ratio: float, dtype: str, op: str, seed: int,
        cast: str | None, approx: bool) -> None:
    """Top-k's one-buffer scatter-add of every rank's payloads equals decompressing each
    rank densely and adding (bit for bit), also behind error feedback and a payload cast."""
    rng = np.random.default_rng(seed)
    spec = f"topk:ratio={ratio!r},approx={int(approx)}" + (f"+{cast}" if cast else "")
    comps = [get_compressor(spec, min_compress_size=1, compress_1d=True) for _ in range(ranks)]
    tensors = [rng.standard_normal((n,)).astype(dtype) for _ in range(ranks)]
    sent = [c.compress(t, "w") for c, t in zip(comps, tensors)]
    per_rank = [payloads for payloads, _ in sent]
    ctx = sent[0][1]
    fast = comps[0].decompress_all(per_rank, ctx, op)
    slow = comps[0].aggregate([comps[0].decompress(p, ctx) for p in per_rank], op)
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    assert np.array_equal(fast, slow)
