"""K-FAC's maths (dlcomm.kfac) against dense references: factors from explicit sums over
samples and patches, preconditioned gradients against an explicit Kronecker-product solve."""
from __future__ import annotations

import numpy as np
import pytest

from dlcomm.kfac import curvature, factors


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def dense_second_moment(rows: np.ndarray, bias: bool) -> np.ndarray:
    """E[a a^T] as a sum of outer products, in float64, with the bias 1 appended."""
    rows = rows.astype(np.float64)
    if bias:
        rows = np.concatenate([rows, np.ones((rows.shape[0], 1))], axis=1)
    return sum(np.outer(r, r) for r in rows) / rows.shape[0]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 6), (1, 1)])
def test_linear_input_factor_is_the_mean_outer_product_with_the_bias_one(
        bias: bool, shape: tuple[int, ...]) -> None:
    x = rng(1).standard_normal(shape).astype(np.float32)
    got = factors.linear_input_factor(x, bias)
    want = dense_second_moment(x.reshape(-1, shape[-1]), bias)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(got, got.T)  # exactly symmetric: what travels is the triangle


def test_linear_output_factor_is_the_mean_outer_product_of_output_gradients() -> None:
    g = rng(2).standard_normal((4, 3, 5)).astype(np.float32)
    np.testing.assert_allclose(factors.linear_output_factor(g),
                               dense_second_moment(g.reshape(-1, 5), False), rtol=1e-5,
                               atol=1e-6)


def test_second_moment_scale_and_float64() -> None:
    x = rng(3).standard_normal((6, 3))
    got = factors.second_moment(x, bias=True, scale=0.25)
    np.testing.assert_allclose(got, 0.25 * dense_second_moment(x, True), rtol=1e-12)
    assert got.dtype == np.float64


def explicit_patches(x: np.ndarray, kh: int, kw: int, stride: tuple[int, int],
                     padding: tuple[int, int], dilation: tuple[int, int]) -> np.ndarray:
    """im2col by loops over output positions: (B, oh, ow, C*kh*kw)."""
    b, c, h, w = x.shape
    ph, pw = padding
    xp = np.zeros((b, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    oh = (h + 2 * ph - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * pw - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((b, oh, ow, c * kh * kw), dtype=x.dtype)
    for i in range(oh):
        for j in range(ow):
            for ci in range(c):
                for u in range(kh):
                    for v in range(kw):
                        out[:, i, j, ci * kh * kw + u * kw + v] = xp[
                            :, ci, i * stride[0] + u * dilation[0], j * stride[1] + v * dilation[1]]
    return out


CONV_CASES = [  # kernel, stride, padding, dilation
    ((3, 3), (1, 1), (1, 1), (1, 1)),
    ((3, 2), (2, 1), (0, 1), (1, 1)),
    ((2, 3), (1, 2), (2, 0), (2, 1)),
    ((1, 1), (1, 1), (0, 0), (1, 1)),
]


@pytest.mark.parametrize("kernel,stride,padding,dilation", CONV_CASES)
def test_conv2d_patches_equal_an_explicit_unfolding(kernel, stride, padding, dilation) -> None:
    x = rng(4).standard_normal((2, 3, 7, 6)).astype(np.float32)
    got = factors.conv2d_patches(x, kernel, stride, padding, dilation)
    np.testing.assert_array_equal(got, explicit_patches(x, *kernel, stride, padding, dilation))


@pytest.mark.parametrize("kernel,stride,padding,dilation", CONV_CASES)
def test_conv2d_patches_times_the_weight_are_torchs_convolution(kernel, stride, padding,
                                                                 dilation) -> None:
    """The feature order matches weight.reshape(out, -1): patches @ W^T + b is the conv."""
    torch = pytest.importorskip("torch")
    x = rng(5).standard_normal((2, 3, 7, 6)).astype(np.float32)
    conv = torch.nn.Conv2d(3, 4, kernel, stride, padding, dilation)
    with torch.no_grad():
        want = conv(torch.from_numpy(x)).numpy().transpose(0, 2, 3, 1)
    patches = factors.conv2d_patches(x, kernel, stride, padding, dilation)
    weight = conv.weight.detach().numpy().reshape(4, -1)
    got = patches @ weight.T + conv.bias.detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_factors_against_dense_references(bias: bool) -> None:
    x = rng(6).standard_normal((3, 2, 5, 5)).astype(np.float32)
    kernel, stride, padding, dilation = (3, 3), (2, 2), (1, 1), (1, 1)
    patches = explicit_patches(x, *kernel, stride, padding, dilation)
    positions = patches.shape[1] * patches.shape[2]
    want_a = dense_second_moment(patches.reshape(-1, patches.shape[-1]), bias) / positions ** 2
    got_a = factors.conv2d_input_factor(x, bias, kernel, stride, padding, dilation)
    np.testing.assert_allclose(got_a, want_a, rtol=1e-5, atol=1e-7)
    grad = rng(7).standard_normal((3, 4, patches.shape[1], patches.shape[2])).astype(np.float32)
    rows = grad.transpose(0, 2, 3, 1).reshape(-1, 4)
    want_g = dense_second_moment(rows, False) / positions ** 2
    np.testing.assert_allclose(factors.conv2d_output_factor(grad), want_g, rtol=1e-5,
                               atol=1e-7)


def test_factor_functions_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        factors.second_moment(np.zeros((0, 3), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        factors.second_moment(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="floating-point"):
        factors.linear_input_factor(np.zeros((2, 3), np.int64), True)
    with pytest.raises(ValueError, match="batch, channels"):
        factors.conv2d_patches(np.zeros((2, 3, 4), np.float32), 3)
    with pytest.raises(ValueError, match="larger than the padded input"):
        factors.conv2d_patches(np.zeros((1, 1, 2, 2), np.float32), 3)


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_upper_triangle_round_trip(n: int) -> None:
    a = rng(n).standard_normal((n, n)).astype(np.float32)
    sym = a + a.T
    packed = factors.pack_upper(sym)
    assert packed.shape == (factors.upper_size(n),) == (n * (n + 1) // 2,)
    assert np.array_equal(factors.unpack_upper(packed, n), sym)
    with pytest.raises(ValueError, match="entries"):
        factors.unpack_upper(packed[:-1], n)
    with pytest.raises(ValueError, match="square"):
        factors.pack_upper(np.zeros((2, 3)))


def test_running_average_starts_from_the_identity() -> None:
    new = np.full((3, 3), 2.0, np.float32)
    first = factors.running_average(None, new, 0.9)
    np.testing.assert_allclose(first, 0.9 * np.eye(3) + 0.1 * new, rtol=1e-6)
    second = factors.running_average(first, new, 0.9)
    np.testing.assert_allclose(second, 0.9 * first + 0.1 * new, rtol=1e-6)
    assert np.array_equal(factors.running_average(first, new, 1.0), first)
    with pytest.raises(ValueError, match="factor_decay"):
        factors.running_average(first, new, 0.0)
    with pytest.raises(ValueError, match="shape changed"):
        factors.running_average(first, np.eye(2, dtype=np.float32), 0.9)


def spd(n: int, seed: int) -> np.ndarray:
    x = rng(seed).standard_normal((n, 3 * n))
    return x @ x.T / (3 * n)


def test_preconditioned_gradient_equals_the_explicit_damped_kronecker_solve_eigen() -> None:
    """Eigen form: (G (x) A + damping I)^-1 vec(V), with vec row-major (V is g x a)."""
    a_dim, g_dim, damping = 4, 3, 0.05
    a, g = spd(a_dim, 1), spd(g_dim, 2)
    v = rng(3).standard_normal((g_dim, a_dim))
    fisher = np.kron(g, a) + damping * np.eye(a_dim * g_dim)
    want = np.linalg.solve(fisher, v.reshape(-1)).reshape(g_dim, a_dim)
    da, qa = curvature.eigen_decomposition(a, np.float64)
    dg, qg = curvature.eigen_decomposition(g, np.float64)
    got = curvature.precondition_eigen(v, qg, qa, curvature.eigen_scale(dg, da, damping))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_preconditioned_gradient_equals_the_explicit_kronecker_solve_inverse() -> None:
    """Inverse form: ((G + d I) (x) (A + d I))^-1 vec(V) = (G + d I)^-1 V (A + d I)^-1."""
    a_dim, g_dim, damping = 5, 2, 0.01
    a, g = spd(a_dim, 4), spd(g_dim, 5)
    v = rng(6).standard_normal((g_dim, a_dim))
    fisher = np.kron(g + damping * np.eye(g_dim), a + damping * np.eye(a_dim))
    want = np.linalg.solve(fisher, v.reshape(-1)).reshape(g_dim, a_dim)
    got = curvature.precondition_inverse(v, curvature.damped_inverse(g, damping, np.float64),
                                         curvature.damped_inverse(a, damping, np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_precondition_in_float32_from_float32_factors() -> None:
    a, g = spd(6, 7).astype(np.float32), spd(4, 8).astype(np.float32)
    v = rng(9).standard_normal((4, 6)).astype(np.float32)
    da, qa = curvature.eigen_decomposition(a)
    dg, qg = curvature.eigen_decomposition(g)
    got = curvature.precondition_eigen(v, qg, qa, curvature.eigen_scale(dg, da, 0.01))
    want = np.linalg.solve(np.kron(g.astype(np.float64), a) + 0.01 * np.eye(24),
                           v.reshape(-1).astype(np.float64)).reshape(4, 6)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4)


def test_damped_inverse_is_exactly_symmetric_and_eigenvalues_are_clamped() -> None:
    a = spd(7, 10).astype(np.float32)
    inv = curvature.damped_inverse(a, 1e-3)
    assert inv.dtype == np.float32 and np.array_equal(inv, inv.T)
    np.testing.assert_allclose(inv @ (a + 1e-3 * np.eye(7)), np.eye(7), atol=1e-3)
    almost_singular = np.outer(np.arange(4.0), np.arange(4.0))  # rank 1, rounding below 0
    values, vectors = curvature.eigen_decomposition(almost_singular)
    assert (values >= 0).all() and vectors.shape == (4, 4)
    with pytest.raises(ValueError, match="damping"):
        curvature.damped_inverse(a, 0.0)
    with pytest.raises(ValueError, match="square"):
        curvature.eigen_decomposition(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="gradient matrix"):
        curvature.precondition_inverse(np.zeros((2, 2)), np.eye(3), np.eye(2))


def test_kl_clip_scale() -> None:
    assert curvature.kl_clip_scale(0.0, 0.001) == 1.0
    assert curvature.kl_clip_scale(5.0, None) == 1.0
    assert curvature.kl_clip_scale(1e-5, 0.001) == 1.0  # small updates are left alone
    assert curvature.kl_clip_scale(0.1, 0.001) == pytest.approx(0.1)
    assert curvature.kl_clip_scale(-0.1, 0.001) == pytest.approx(0.1)
    with pytest.raises(FloatingPointError, match="not finite"):
        curvature.kl_clip_scale(float("nan"), 0.001)


def test_a_framework_linalg_gives_the_same_decompositions() -> None:
    """The torch front end hands in torch's LAPACK; results match numpy's."""
    pytest.importorskip("torch")
    from dlcomm.torch.kfac.linalg import TORCH_LINALG

    a = spd(9, 11).astype(np.float32)
    np.testing.assert_allclose(curvature.damped_inverse(a, 0.01, linalg=TORCH_LINALG),
                               curvature.damped_inverse(a, 0.01), rtol=1e-4, atol=1e-5)
    values, vectors = curvature.eigen_decomposition(a, linalg=TORCH_LINALG)
    ref_values, _ = curvature.eigen_decomposition(a)
    np.testing.assert_allclose(values, ref_values, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(vectors @ np.diag(values) @ vectors.T, a, rtol=1e-4, atol=1e-5)
    assert values.dtype == vectors.dtype == np.float32
