"""Error feedback's momentum correction (DGC's memory) against a hand computation of the
published update rule, and the properties it relies on (the optimizer's buffer equals the
reduced velocity; momentum 0 is plain error feedback; the masking rule of each selection)."""
from __future__ import annotations

import numpy as np
import pytest
from compression_reference import simulate

from dlcomm.compression import ErrorFeedback, get_compressor

MU = 0.9


def make(spec: str, momentum: float = MU, **kwargs: object):
    c = get_compressor(spec, min_compress_size=0, **kwargs)
    c.set_momentum(momentum)
    return c


def grads(size: int, step: int, shape: tuple = (12, 10), dtype=np.float64) -> list:
    return [np.random.default_rng([r, step, 3]).standard_normal(shape).astype(dtype)
            for r in range(size)]


def topk_mask(v: np.ndarray, k: int) -> np.ndarray:
    """True at the k largest |v| (by full sort; no ties in random data)."""
    mask = np.zeros(v.size, bool)
    mask[np.argsort(-np.abs(v.reshape(-1)), kind="stable")[:k]] = True
    return mask.reshape(v.shape)


# -- top-k: Deep Gradient Compression's algorithm, by hand ------------------------------------
@pytest.mark.parametrize("size", [1, 3])
def test_topk_momentum_correction_is_dgc(size):
    """Lin et al. (DGC), per rank: u = m u + g; v = v + u; send v where top-k, then zero
    v and u there (momentum factor masking). The optimizer (momentum m) receives
    R_t - m R_{t-1}, R_t the average of what the ranks sent."""
    k = 6
    cs = [make("topk:ratio=0.05") for _ in range(size)]
    u = [np.zeros((12, 10)) for _ in range(size)]
    v = [np.zeros((12, 10)) for _ in range(size)]
    previous = np.zeros((12, 10))
    for step in range(5):
        g = grads(size, step)
        sent = []
        for r in range(size):
            u[r] = MU * u[r] + g[r]
            v[r] = v[r] + u[r]
            mask = topk_mask(v[r], k)
            sent.append(np.where(mask, v[r], 0))
            v[r] = np.where(mask, 0, v[r])
            u[r] = np.where(mask, 0, u[r])
        result = np.mean(sent, axis=0)
        out = simulate(cs, g, "w")
        np.testing.assert_allclose(out, result - MU * previous, rtol=1e-12, atol=1e-12)
        for r in range(size):
            np.testing.assert_allclose(cs[r].residual("w"), v[r], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(cs[r].velocity("w"), u[r], rtol=1e-12, atol=1e-12)
        previous = result


def test_the_optimizers_momentum_buffer_equals_the_reduced_velocity():
    """torch.optim.SGD(momentum=m) fed R_t - m R_{t-1} keeps buf == R_t, so it steps by
    lr * R_t: the compressed velocity, applied once."""
    torch = pytest.importorskip("torch")
    cs = [make("gtopk:ratio=0.1") for _ in range(2)]
    w = torch.zeros(12, 10, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.5, momentum=MU)
    velocity_sum = np.zeros((12, 10))
    for step in range(6):
        g = grads(2, step)
        w.grad = torch.from_numpy(simulate(cs, g, "w"))
        opt.step()
        reduced = cs[0].results["w"]  # gtopk's last round is an all-reduce: the sum
        np.testing.assert_allclose(opt.state[w]["momentum_buffer"].numpy(), reduced / 2,
                                   rtol=1e-12, atol=1e-12)
        velocity_sum += reduced / 2
        np.testing.assert_allclose(w.detach().numpy(), -0.5 * velocity_sum, rtol=1e-10,
                                   atol=1e-12)


def test_without_momentum_error_feedback_is_unchanged_bit_for_bit():
    for spec in ("topk:ratio=0.05", "efsignsgd", "acpsgd:rank=2", "gtopk:ratio=0.05",
                 "powersgd:rank=2+fp16", "randomk:ratio=0.1,ef=1"):
        plain = [get_compressor(spec, min_compress_size=0) for _ in range(2)]
        zero = [make(spec, 0.0) for _ in range(2)]
        for step in range(4):
            g = grads(2, step, dtype=np.float32)
            np.testing.assert_array_equal(simulate(plain, g, "w"), simulate(zero, g, "w"))
            np.testing.assert_array_equal(plain[0].residual("w"), zero[0].residual("w"))
        assert zero[0].velocity("w") is None and not zero[0].results


# -- the masking rule of each kind of selection ------------------------------------------------
def test_low_rank_masking_removes_the_sent_subspace_from_the_velocity():
    """ACP-SGD step 0 sends P = acc Q^ (right projection onto Q^ = orth(Q0)), step 1 sends
    Q = acc^T P^ (left projection onto P^ = orth(reduced P)): the velocity loses exactly
    that projection, u - u Q^ Q^T and then u - P^ P^T u."""
    c = make("acpsgd:rank=3")
    from compression_reference import lowrank_factor

    q_hat, _ = np.linalg.qr(lowrank_factor(0, "w", 0, (10, 3)))
    g0, g1 = grads(1, 0)[0], grads(1, 1)[0]
    simulate([c], [g0], "w")
    u0 = g0 - g0 @ q_hat @ q_hat.T
    np.testing.assert_allclose(c.velocity("w"), u0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c.residual("w"), u0, rtol=1e-10, atol=1e-12)  # acc = g0 at step 0
    p_hat, _ = np.linalg.qr(g0 @ q_hat)
    simulate([c], [g1], "w")
    u1 = MU * u0 + g1
    np.testing.assert_allclose(c.velocity("w"), u1 - p_hat @ p_hat.T @ u1, rtol=1e-10,
                               atol=1e-12)


def test_sign_masking_keeps_the_unsent_share_of_each_coordinate():
    """Scaled sign has no linear selection: each coordinate keeps clip(e / acc, 0, 1) of its
    velocity, the share error feedback kept (0 where the step overshot)."""
    c = make("efsignsgd")
    g0, g1 = grads(1, 0)[0], grads(1, 1)[0]
    simulate([c], [g0], "w")
    acc = g0
    sent = np.abs(acc).mean() * np.where(acc >= 0, 1.0, -1.0)
    e = acc - sent
    u = g0 * np.clip(e / acc, 0, 1)
    np.testing.assert_allclose(c.residual("w"), e, rtol=1e-12)
    np.testing.assert_allclose(c.velocity("w"), u, rtol=1e-12)
    out = simulate([c], [g1], "w")
    u = MU * u + g1
    acc = u + e
    sent1 = np.abs(acc).mean() * np.where(acc >= 0, 1.0, -1.0)
    np.testing.assert_allclose(out, sent1 - MU * sent, rtol=1e-12)


def test_acpsgd_residual_from_the_local_factor_sums_like_the_reduced_one():
    """ACP-SGD's reference code (and ours) sets e_i = acc_i - P_i Q^T with this rank's own,
    un-reduced P_i; PowerSGD's paper and torch's hook use the reduced product instead. For a
    linear selection both give the same sum of residuals over ranks, and every later step
    depends on the residuals only through that sum, so the two train identically."""
    size = 3
    cs = [get_compressor("acpsgd:rank=2", min_compress_size=0) for _ in range(size)]
    residuals = [np.zeros((12, 10)) for _ in range(size)]
    for step in range(4):
        g = grads(size, step)
        accs = [gi + ei for gi, ei in zip(g, residuals)]
        mean = simulate(cs, g, "w")
        reduced_style = [acc - mean for acc in accs]  # e_i = acc_i - (reduced product) / P
        residuals = [c.residual("w") for c in cs]
        np.testing.assert_allclose(np.sum(residuals, axis=0), np.sum(reduced_style, axis=0),
                                   rtol=1e-10, atol=1e-10)
        assert not np.allclose(residuals[0], reduced_style[0])  # per rank they differ


def test_set_momentum_validates_and_plain_compressors_ignore_it():
    for bad in (-0.1, 1.0, 1.5, "0.9", True, None):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            get_compressor("topk").set_momentum(bad)
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            get_compressor("qsgd").set_momentum(bad)
    c = get_compressor("qsgd:levels=4", min_compress_size=0)
    c.set_momentum(0.9)  # no error feedback: the optimizer's momentum stays where it was
    x = grads(1, 0)[0]
    ref = get_compressor("qsgd:levels=4", min_compress_size=0)
    np.testing.assert_array_equal(simulate([c], [x], "w"), simulate([ref], [x], "w"))
    ef = get_compressor("powersgd:rank=2+fp16")
    ef.set_momentum(0.5)
    assert isinstance(ef, ErrorFeedback) and ef.momentum == 0.5
    ef.reset_state()
    assert not ef.velocities and not ef.results


@pytest.mark.skipif(not __import__("dlcomm.kernels").kernels.available(),
                    reason="the native kernels are not built")
def test_native_approx_topk_with_momentum_equals_the_reference_path(monkeypatch):
    """The fused native selection (approx top-k, float32, large enough for the threshold
    search) masks the velocity in place and steps the optimizer's momentum in place: the
    payloads, residuals, velocities and corrected results equal the numpy path's bit for
    bit, step after step."""
    from dlcomm import kernels

    n, steps = 300_007, 4
    native, reference = (make("topk:ratio=0.01,approx=1") for _ in range(2))
    for step in range(steps):
        g = np.random.default_rng([step, 7]).standard_normal(n).astype(np.float32)
        p_native, ctx_native = native.compress(g.copy(), "w")
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "available", lambda: False)
            p_ref, ctx_ref = reference.compress(g.copy(), "w")
        for a, b in zip(p_native, p_ref):
            assert np.array_equal(a, b), step
        assert np.array_equal(native.residual("w"), reference.residual("w")), step
        assert np.array_equal(native.velocity("w"), reference.velocity("w")), step
        # the velocity is masked: zero wherever this step sent
        assert not native.velocity("w")[p_native[1]].any()
        other = (p_ref[0] * np.float32(0.5), p_ref[1])  # a second rank's payload
        out_native = native.decompress_all([p_native, other], ctx_native)
        out_ref = reference.decompress_all([p_ref, other], ctx_ref)
        assert np.array_equal(out_native, out_ref), step


@pytest.mark.parametrize("spec", ["topk:ratio=0.05", "topk:ratio=0.05,approx=1",
                                  "gtopk:ratio=0.05", "efsignsgd"])
def test_the_kept_reduced_velocity_is_not_what_the_caller_gets(spec):
    """``decompress_all``'s new array is kept as ``R_t`` without a copy: what the optimizer
    receives is always another array, so a caller that writes into it (an adapter filling a
    gradient in place) cannot change the next step's correction."""
    size = 3
    clean = [make(spec) for _ in range(size)]
    dirty = [make(spec) for _ in range(size)]
    for step in range(4):
        tensors = grads(size, step)
        want = simulate(clean, [t.copy() for t in tensors], "w")
        got = simulate(dirty, [t.copy() for t in tensors], "w")
        np.testing.assert_array_equal(got, want)
        for c in dirty:
            assert not np.may_share_memory(c.results["w"], got)
        got[...] = 1e30  # the caller scribbles on its result
