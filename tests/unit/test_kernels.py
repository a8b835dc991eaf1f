"""dlcomm.kernels: every C++ kernel equals its numpy reference bit for bit.

Inputs are random bit patterns (so NaNs with payloads, infinities, subnormals and -0 all
occur) drawn by hypothesis, plus arrays above the OpenMP threshold; each kernel runs with its
AVX2/F16C path and with the portable scalar path forced.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

import dlcomm.kernels as native
from dlcomm.bfloat16 import bf16_bits_to_float, float_to_bf16_bits

needs_library = pytest.mark.skipif(
    not native.available(), reason=f"native library not in use: {native.load_error()}"
)
SETTINGS = settings(max_examples=60, deadline=None)
BIG = (1 << 18) + 13  # above the OpenMP threshold, not a multiple of 8 or 64
FLOATS = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}


@pytest.fixture(params=[True, False], ids=["simd", "scalar"])
def simd(request):
    """Run the test with the SIMD paths on, then forced off."""
    native.set_simd(request.param)
    yield request.param
    native.set_simd(True)


SHAPES = array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=70)


def bits_of(dtype, shape=SHAPES):
    """Arrays of ``dtype`` holding any bit pattern (NaN payloads, inf, subnormals, -0)."""
    uint = FLOATS[dtype]
    return arrays(uint, shape).map(lambda a: a.view(dtype))


def random_bits(dtype, n, seed=0):
    uint = FLOATS[dtype]
    info = np.iinfo(uint)
    return np.random.default_rng(seed).integers(0, info.max, n, dtype=uint, endpoint=True).view(
        dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def half_range_floats(n, seed=0):
    """float32 values around float16's normal, subnormal and overflow ranges, ties included."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 18, n))).astype(np.float32)
    ties = np.arange(n // 4, dtype=np.uint32)  # halfway cases of the 13 dropped bits
    x[: n // 4] = ((rng.integers(0x33000000, 0x47800000, n // 4, dtype=np.uint32) & ~np.uint32(
        0x1FFF)) | np.uint32(0x1000) | (ties << np.uint32(31))).view(np.float32)
    return x


# ---- float16 -------------------------------------------------------------------------------
@needs_library
@SETTINGS
@given(x=bits_of(np.float32))
def test_float32_to_float16_equals_astype(x):
    for enabled in (True, False):
        native.set_simd(enabled)
        with np.errstate(all="ignore"):
            assert same_bits(native.float32_to_float16(x), x.astype(np.float16))
    native.set_simd(True)


@needs_library
def test_float16_casts_on_large_arrays(simd):
    with np.errstate(all="ignore"):
        for x in (random_bits(np.float32, BIG), half_range_floats(BIG)):
            assert same_bits(native.float32_to_float16(x), x.astype(np.float16))
    h = random_bits(np.float16, BIG, seed=1)
    assert same_bits(native.float16_to_float32(h), h.astype(np.float32))


@needs_library
@SETTINGS
@given(h=bits_of(np.float16))
def test_float16_to_float32_equals_astype(h):
    for enabled in (True, False):
        native.set_simd(enabled)
        assert same_bits(native.float16_to_float32(h), h.astype(np.float32))
    native.set_simd(True)


@needs_library
@SETTINGS
@given(data=st.data())
def test_float16_add_equals_numpy_add(data):
    a = data.draw(bits_of(np.float16))
    b = data.draw(arrays(np.uint16, a.shape).map(lambda v: v.view(np.float16)))
    with np.errstate(all="ignore"):
        expected = np.add(a, b)
    for enabled in (True, False):
        native.set_simd(enabled)
        out = b.copy()
        assert native.float16_add_(a, out) is out
        assert same_bits(out, expected)
    native.set_simd(True)


@needs_library
def test_float16_add_special_pairs_and_large(simd):
    specials = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                         0x7C01, 0x7E00, 0xFD23, 0xFFFF, 0x3C00, 0xBC00], dtype=np.uint16)
    a, b = (m.ravel().view(np.float16) for m in np.meshgrid(specials, specials))
    big_a, big_b = random_bits(np.float16, BIG, 2), random_bits(np.float16, BIG, 3)
    for x, y in ((a, b), (big_a, big_b)):
        with np.errstate(all="ignore"):
            expected = np.add(x, y)
        assert same_bits(native.float16_add_(x, y.copy()), expected)


@needs_library
@pytest.mark.parametrize("factor", [0.25, 1 / 3, 3.0, 1e4, -0.5, 1e-8])
def test_float16_scale_equals_the_numpy_reference(simd, factor):
    """kernels.scale_into gives array_api.scale_into's bits on float16 (every bit pattern,
    NaN/inf/subnormals included, and a size past one staging block), in place and not."""
    from dlcomm.array_api import scale_into as reference

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    for x in (every, random_bits(np.float16, 3 * (1 << 18) + 5, 4)):
        want = np.empty_like(x)
        with np.errstate(all="ignore"):
            reference(x, factor, want)
            got = np.full_like(x, 7)
            native.scale_into(x, factor, got)
            assert same_bits(got, want)
            inplace = x.copy()
            native.scale_into(inplace, factor, inplace)
            assert same_bits(inplace, want)


# ---- bfloat16 -------------------------------------------------------------------------------
@needs_library
@SETTINGS
@given(x=bits_of(np.float32))
def test_bf16_casts_equal_reference(x):
    bits = native.float32_to_bf16_bits(x)
    assert same_bits(bits, float_to_bf16_bits(x).reshape(x.shape))
    wide = x.view(np.uint32).astype(np.uint16)  # any bf16 pattern
    assert same_bits(native.bf16_bits_to_float32(wide),
                     bf16_bits_to_float(wide.reshape(-1)).reshape(wide.shape))


@needs_library
def test_bf16_add_equals_reference_on_large_arrays():
    a = random_bits(np.float16, BIG, 4).view(np.uint16)
    b = random_bits(np.float16, BIG, 5).view(np.uint16)
    with np.errstate(all="ignore"):
        expected = float_to_bf16_bits(bf16_bits_to_float(a) + bf16_bits_to_float(b))
    assert same_bits(native.bf16_add_(a, b.copy()), expected)
    x = random_bits(np.float32, BIG, 6)
    assert same_bits(native.float32_to_bf16_bits(x), float_to_bf16_bits(x))


# ---- signs ----------------------------------------------------------------------------------
@needs_library
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 1000, BIG])
def test_sign_pack_unpack_equal_numpy(simd, dtype, n):
    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    x[::5], x[::7], x[::11], x[::13] = 0, -0.0, np.nan, -np.inf
    if n > 3:
        x[3] = np.array(0x8000, np.uint16).view(np.float16) if dtype == np.float16 else -0.0
    packed = native.pack_signs(x)
    assert same_bits(packed, np.packbits(x >= 0))
    assert same_bits(native.unpack_signs(packed, n, dtype),
                     np.unpackbits(packed)[:n].astype(dtype) * 2 - 1)
    for scale in (0.37, -2.5, np.inf, np.nan, 0.0):
        s = np.array([scale])
        expected = (np.unpackbits(packed)[:n].astype(dtype) * 2 - 1) * s.astype(dtype)
        assert same_bits(native.unpack_signs(packed, n, dtype, s), expected)


@needs_library
@SETTINGS
@given(x=bits_of(np.float32, array_shapes(max_dims=1, max_side=200)))
def test_sign_pack_any_bits(x):
    for enabled in (True, False):
        native.set_simd(enabled)
        assert same_bits(native.pack_signs(x), np.packbits(x >= 0))
    native.set_simd(True)


# ---- threshold selection with error feedback -------------------------------------------------
def reference_select(grad, threshold, residual, index_dtype):
    with np.errstate(all="ignore"):
        acc = grad.copy() if residual is None else grad + residual
        flat = acc.reshape(-1)
        idx = np.flatnonzero(np.abs(flat) >= threshold)
        estimate = np.zeros_like(flat)
        estimate[idx] = flat[idx]
        return flat[idx], idx.astype(index_dtype), np.subtract(flat, estimate).reshape(acc.shape)


@needs_library
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 100, BIG])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_ef_select_equals_reference(dtype, n, with_residual, index_dtype):
    rng = np.random.default_rng(n)
    grad = rng.standard_normal(n).astype(dtype)
    grad[::17], grad[::19], grad[::23] = np.inf, np.nan, -0.0
    residual = rng.standard_normal(n).astype(dtype) if with_residual else None
    threshold = dtype(1.7)
    got = native.ef_select(grad, threshold, residual, index_dtype)
    expected = reference_select(grad, threshold, residual, index_dtype)
    for g, e in zip(got, expected):
        assert same_bits(g, e)
    with np.errstate(all="ignore"):
        assert native.count_above(grad, threshold, residual) == expected[1].size


@needs_library
def test_ef_select_reuses_its_buffers_without_aliasing_its_results():
    """The output buffers are kept per thread and reused (no fresh pages to fault in every
    call); what a call returns is its own, untouched by later calls, in any thread."""
    import threading

    rng = np.random.default_rng(11)
    grads = [rng.standard_normal(BIG).astype(np.float32) for _ in range(3)]
    first = native.ef_select(grads[0], 1.5)
    kept = [a.copy() for a in first]
    native.ef_select(grads[1], 0.5)  # more picks, written over the same buffers
    for a, b in zip(first, kept):
        assert same_bits(a, b)
    assert not np.shares_memory(first[0], native.ef_select(grads[2], 1.5)[0])
    results = {}

    def work(i: int) -> None:
        for _ in range(5):
            results[i] = native.ef_select(grads[i], 1.0 + i / 4)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        for g, e in zip(results[i], reference_select(grads[i], np.float32(1.0 + i / 4), None,
                                                     np.int32)):
            assert same_bits(g, e)


@needs_library
@SETTINGS
@given(data=st.data())
def test_ef_select_any_bits(data):
    grad = data.draw(bits_of(np.float32))
    residual = data.draw(st.none() | arrays(np.uint32, grad.shape).map(
        lambda v: v.view(np.float32)))
    threshold = data.draw(st.floats(0, 2.0**100, width=32))
    got = native.ef_select(grad, threshold, residual)
    for g, e in zip(got, reference_select(grad, np.float32(threshold), residual, np.int32)):
        assert same_bits(g, e)


# ---- argument checks and fallbacks (run with or without the library) ------------------------
def test_bad_arguments_raise():
    x = np.zeros(8, np.float32)
    with pytest.raises(TypeError, match="float32"):
        native.float32_to_float16(np.zeros(8, np.float64))
    with pytest.raises(TypeError, match="numpy.ndarray"):
        native.float16_to_float32([1.0])
    with pytest.raises(ValueError, match="shapes differ"):
        native.float16_add_(np.zeros(3, np.float16), np.zeros(4, np.float16))
    with pytest.raises(ValueError, match="1-D"):
        native.pack_signs(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="n must be"):
        native.unpack_signs(np.zeros(1, np.uint8), 9, np.float32)
    with pytest.raises(TypeError, match="dtype"):
        native.unpack_signs(np.zeros(1, np.uint8), 8, np.int32)
    with pytest.raises(TypeError, match="index_dtype"):
        native.ef_select(x, 1.0, index_dtype=np.int16)
    with pytest.raises(TypeError, match="residual"):
        native.ef_select(x, 1.0, np.zeros(8, np.float64))
    with pytest.raises(ValueError, match="shape"):
        native.float32_to_float16(x, out=np.zeros(4, np.float16))
    with pytest.raises(ValueError, match="n must be"):
        native.set_num_threads(-1)


def test_non_contiguous_inputs_use_numpy():
    x = np.arange(32, dtype=np.float32)[::2] - 7
    assert same_bits(native.float32_to_float16(x), x.astype(np.float16))
    assert same_bits(native.pack_signs(x), np.packbits(x >= 0))
    assert native.count_above(x, 3.0) == int(np.count_nonzero(np.abs(x) >= 3))


def test_status_functions():
    assert isinstance(native.available(), bool)
    assert native.num_threads() >= 1
    assert (native.load_error() is None) == native.available()


# ---- float16 all-reduce through dlcomm on real ranks ----------------------------------------
FLOAT16_ALLREDUCE_SCRIPT = """
import os, sys
import numpy as np
from mpi4py import MPI
import dlcomm
import dlcomm.kernels

calls = [0]
real_add = dlcomm.kernels.float16_add_


def counting_add(a, b):
    calls[0] += 1
    return real_add(a, b)


dlcomm.kernels.float16_add_ = counting_add  # the sums look it up at each call
dlcomm.init()
rank = dlcomm.rank()
rng = np.random.default_rng(100 + rank)
finite = (rng.standard_normal(300_000) * 50).astype(np.float16)
specials = rng.integers(0, 2**16, 5_000, dtype=np.uint16).view(np.float16)  # NaN, inf, tiny
tensors = {"finite": finite, "specials": specials}
out = {}
ordered = os.environ["DLCOMM_ALLREDUCE_ALGORITHM"] == "ordered"
for name, x in tensors.items():
    out[name] = dlcomm.allreduce(x, name=name, op=dlcomm.Sum)
    if ordered:  # Peer: numpy adding every rank's copy in rank order, incoming first.
        copies = MPI.COMM_WORLD.allgather(x)
        raw = copies[0].copy()
        with np.errstate(all="ignore"):
            for c in copies[1:]:
                np.add(c, raw, out=raw)
    else:  # Peer: raw mpi4py with a numpy user op, the pre-native code path.
        def add(inbuf, inoutbuf, datatype):
            b = np.frombuffer(inoutbuf, dtype=np.float16)
            np.add(np.frombuffer(inbuf, dtype=np.float16), b, out=b)
        op = MPI.Op.Create(add, commute=True)
        raw = x.copy()
        with np.errstate(all="ignore"):
            MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, raw.view(np.int16), op=op)
        op.Free()
    assert out[name].tobytes() == raw.tobytes(), f"rank {rank}: {name} differs from numpy"
np.savez(sys.argv[1] + f"/rank{rank}.npz", **out)
print("native", dlcomm.kernels.available(), "kernel used", calls[0] > 0, flush=True)
dlcomm.shutdown()
"""


@needs_library
def test_float16_allreduce_bit_identical_with_and_without_native(tmp_path):
    from mpi_run import run_mpi  # noqa: PLC0415 - tests/ helper

    # Both all-reduce algorithms that sum float16 with the kernel: the default (ordered,
    # rank order, against numpy in rank order: the same bits on every rank, NaNs included)
    # and native (MPI's user op, against a numpy user op).
    for algorithm in ("ordered", "native"):
        results = {}
        for flag in ("1", "0"):
            folder = tmp_path / f"{algorithm}{flag}"
            folder.mkdir()
            proc = run_mpi(2, FLOAT16_ALLREDUCE_SCRIPT, tmp_path, timeout=120, args=[str(folder)],
                           env={"DLCOMM_NATIVE": flag, "DLCOMM_ALLREDUCE_ALGORITHM": algorithm})
            used = flag == "1"
            lines = [f"native {used} kernel used {u}\n" for u in (True, False)]
            assert all(out in lines for out in proc.rank_stdout), proc.report()
            # ordered reduces a block on every rank; MPI's own algorithm decides which ranks
            # combine (an algorithm may reduce on one rank, then send the result).
            kernel_on = [out == lines[0] for out in proc.rank_stdout]
            assert (all(kernel_on) if used and algorithm == "ordered" else
                    any(kernel_on) == used), proc.report()
            results[flag] = [np.load(folder / f"rank{r}.npz") for r in range(2)]
        for r in range(2):
            for name in ("finite", "specials"):
                assert same_bits(results["1"][r][name], results["0"][r][name]), (r, name)
        assert same_bits(results["1"][0]["finite"], results["1"][1]["finite"])
        if algorithm == "ordered":
            assert same_bits(results["1"][0]["specials"], results["1"][1]["specials"])


# ---- compressors: native path equals the numpy path ----------------------------------------
def run_compressor_steps(spec, tensors):
    """Payloads, decompressed tensors and residuals of ``spec`` over successive steps."""
    from dlcomm.compression.registry import get_compressor  # noqa: PLC0415

    c = get_compressor(spec, min_compress_size=0)
    out = []
    for step, x in enumerate(tensors):
        payloads, ctx = c.compress(x, "w")
        decoded = c.decompress(payloads, ctx)
        residual = c.residual("w") if hasattr(c, "residual") else None
        out.append((step, payloads, decoded, None if residual is None else residual.copy()))
    return out


@needs_library
@pytest.mark.parametrize("spec", ["fp16", "bf16", "efsignsgd", "signum", "topk:ratio=0.01",
                                  "topk:ratio=0.01,approx=1", "topk:ratio=0.3,approx=1"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_compressors_native_equal_numpy(monkeypatch, spec, dtype):
    rng = np.random.default_rng(7)
    tensors = [rng.standard_normal((256, 1031)).astype(dtype) for _ in range(3)]
    with np.errstate(all="ignore"):
        tensors[1][0, :9] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-8, -1e-8, 7e4, -7e4]
        fast = run_compressor_steps(spec, tensors)
        monkeypatch.setattr(native, "_LIB", None)
        reference = run_compressor_steps(spec, tensors)
    for (step, p_fast, d_fast, r_fast), (_, p_ref, d_ref, r_ref) in zip(fast, reference):
        assert len(p_fast) == len(p_ref)
        for a, b in zip(p_fast, p_ref):
            assert same_bits(np.asarray(a), np.asarray(b)), (spec, step)
        assert same_bits(d_fast, d_ref), (spec, step)
        if r_ref is not None:
            assert same_bits(r_fast, r_ref), (spec, step)


@needs_library
def test_fused_topk_error_feedback_is_used(monkeypatch):
    calls = []
    real = native.ef_select
    monkeypatch.setattr(native, "ef_select", lambda *a, **k: calls.append(1) or real(*a, **k))
    grads = np.random.default_rng(3).standard_normal((2, 512, 512)).astype(np.float32)
    steps = run_compressor_steps("topk:ratio=0.01,approx=1", list(grads))
    assert len(calls) == 2
    values, indices = steps[1][1]
    assert 0.75 * 2621 <= indices.size <= 1.25 * 2621 and values.size == indices.size


def test_default_threads_follow_the_launchers_share_of_the_cores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DLCOMM_NATIVE_THREADS", "OMP_NUM_THREADS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert native._default_threads() == 0  # OpenMP's own default outside MPI
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1")  # one rank per emulated host ...
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # ... but dlcommrun's share of this machine
    assert native._default_threads() == 1
    monkeypatch.setenv("DLCOMM_NATIVE_THREADS", "3")  # the explicit knob wins
    assert native._default_threads() == 3


# ---- sparse into dense, momentum correction's step ------------------------------------------
@needs_library
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n,k", [(1, 1), (10, 0), (1000, 37), (BIG, 5000)])
def test_scatter_add_equals_numpy_fancy_add(dtype, index_dtype, n, k):
    rng = np.random.default_rng(n + k)
    out = random_bits(dtype, n, seed=1)
    indices = rng.integers(0, n, k).astype(index_dtype)  # repeats included
    values = random_bits(dtype, k, seed=2)
    expected = out.copy()
    expected[indices] += values
    native.scatter_add_(out, indices, values)
    assert same_bits(out, expected)


@needs_library
def test_scatter_add_repeated_index_keeps_its_last_sum_and_bad_indices_act_as_numpy():
    out = np.zeros(4, np.float32)
    native.scatter_add_(out, np.array([1, 1, 3], np.int32), np.array([1, 2, 5], np.float32))
    assert out.tolist() == [0, 2, 0, 5]
    native.scatter_add_(out, np.array([-1], np.int64), np.array([1], np.float32))  # wraps
    assert out.tolist() == [0, 2, 0, 6]
    with pytest.raises(IndexError):
        native.scatter_add_(out, np.array([0, 4], np.int32), np.array([1, 1], np.float32))
    assert out.tolist() == [0, 2, 0, 6]  # the kernel wrote nothing before numpy raised
    two_d = np.zeros((3, 4), np.float64)
    native.scatter_add_(two_d, np.array([5, 11], np.int32), np.array([1, 2], np.float64))
    assert two_d[1, 1] == 1 and two_d[2, 3] == 2 and two_d.sum() == 3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 1000, BIG])
@pytest.mark.parametrize("momentum", [0.9, 0.5, 1 / 3])
def test_velocity_step_equals_the_numpy_passes(dtype, n, momentum):
    result, kept = random_bits(dtype, n, seed=3), random_bits(dtype, n, seed=4)
    expected_result = kept * kept.dtype.type(-momentum)
    expected_result += result
    expected_kept = result.copy()
    native.velocity_step_(result, kept, momentum)
    assert same_bits(result, expected_result) and same_bits(kept, expected_kept)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 1000, BIG])
@pytest.mark.parametrize("with_residual", [True, False])
def test_momentum_count_above_updates_and_counts_as_numpy(dtype, n, with_residual):
    rng = np.random.default_rng(n)
    velocity, grad = (rng.standard_normal(n).astype(dtype) for _ in range(2))
    residual = rng.standard_normal(n).astype(dtype) if with_residual else None
    expected = velocity * dtype(0.9)
    expected += grad
    acc = expected if residual is None else expected + residual
    count = native.momentum_count_above_(velocity, grad, 0.9, 1.0, residual)
    assert same_bits(velocity, expected)
    assert count == int(np.count_nonzero(np.abs(acc) >= dtype(1.0)))


@pytest.mark.parametrize("max_rounds", [8, 0])
@pytest.mark.parametrize("with_residual", [True, False])
def test_topk_with_a_momentum_update_equals_updating_first(max_rounds, with_residual):
    """The velocity update folded into the first count gives the update's bits and the
    selection made on the updated velocity (also when no count runs)."""
    from dlcomm.compression.topk_select import native_topk_with_residual

    rng = np.random.default_rng(5)
    n, k = 300_000, 3000
    velocity, grad = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    residual = rng.standard_normal(n).astype(np.float32) if with_residual else None
    updated = velocity * np.float32(0.9)
    updated += grad
    expected = native_topk_with_residual(updated, residual, k, max_rounds=max_rounds)
    got = native_topk_with_residual(velocity, residual, k, max_rounds=max_rounds,
                                    momentum_update=(grad, 0.9))
    assert same_bits(velocity, updated)
    if expected is None:
        assert got is None
    else:
        assert all(same_bits(a, b) for a, b in zip(got, expected))
    # where the kernels do not apply (float16), the update is still made
    half = velocity.astype(np.float16)
    assert native_topk_with_residual(half, None, k, momentum_update=(
        grad.astype(np.float16), 0.5)) is None
    reference = velocity.astype(np.float16) * np.float16(0.5)
    reference += grad.astype(np.float16)
    assert same_bits(half, reference)
