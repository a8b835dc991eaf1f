"""QSGD with buckets (one norm per 512 elements by default) and the max-norm variant, against
hand computations; unbiasedness and the variance the buckets remove."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from compression_reference import simulate

from dlcomm.compression import get_compressor
from dlcomm.compression.qsgd import QSGD


def test_qsgd_quantises_each_bucket_against_its_own_norm():
    x = np.random.default_rng(11).standard_normal(1100)
    x[512:1024] *= 100.0  # a loud bucket must not drown the quiet ones
    c = QSGD(levels=4, seed=2, bucket=512, norm=2, min_compress_size=0, compress_1d=True)
    (norms, q), ctx = c.compress(x, "v")
    np.testing.assert_allclose(norms, [np.linalg.norm(x[:512]), np.linalg.norm(x[512:1024]),
                                       np.linalg.norm(x[1024:])], rtol=1e-12)
    noise = np.random.default_rng([2, zlib.crc32(b"v"), 0]).random(
        1100, dtype=np.float32)
    norm = np.repeat(norms, 512)[:1100]
    unit = norm / 4
    levels = np.minimum(np.floor(np.abs(x) * (4 / norm) + noise), 4) * np.sign(x)
    np.testing.assert_array_equal(q, levels.astype(np.int8))
    out = c.decompress([norms, q], ctx)
    np.testing.assert_allclose(out, levels * unit, rtol=1e-12)
    assert np.abs(out[:512]).max() <= np.linalg.norm(x[:512]) + 1e-12


def test_qsgd_max_norm_levels_by_hand():
    """norm=inf (the default): level spacing max|bucket| / s, every |x| within the levels."""
    x = np.random.default_rng(13).standard_normal(700)
    c = QSGD(levels=8, seed=4, bucket=256, min_compress_size=0, compress_1d=True)
    (norms, q), ctx = c.compress(x, "m")
    np.testing.assert_array_equal(norms, [np.abs(b).max() for b in np.split(x, [256, 512])])
    noise = np.random.default_rng([4, zlib.crc32(b"m"), 0]).random(
        700, dtype=np.float32)
    norm = np.repeat(norms, 256)[:700]
    levels = np.floor(np.abs(x) * (8 / norm) + noise) * np.sign(x)
    np.testing.assert_array_equal(q, levels.astype(np.int8))
    assert np.abs(q).max() <= 8


@pytest.mark.parametrize("norm", [2, float("inf")])
def test_qsgd_buckets_are_unbiased_and_cut_the_variance(norm):
    x = np.random.default_rng(12).standard_normal(4096)
    trials = 400
    error = {}
    for bucket in (512, 4096):
        c = QSGD(levels=16, seed=5, bucket=bucket, norm=norm, min_compress_size=0,
                 compress_1d=True)
        outs = np.array([simulate([c], [x], "v") for _ in range(trials)])
        blocks = x.reshape(-1, bucket)
        scale = np.abs(blocks).max(1) if norm == float("inf") else np.linalg.norm(blocks, axis=1)
        unit = np.repeat(scale, bucket) / 16
        assert np.all(np.abs(outs.mean(axis=0) - x) <= 5 * unit / 2 / np.sqrt(trials))
        error[bucket] = np.mean((outs - x) ** 2)
    # One norm per 512 elements instead of per 4096: the L2 bound shrinks with sqrt(d); the
    # largest magnitude of 512 normal values is only a little below that of 4096.
    assert error[512] < error[4096] / (1.5 if norm == 2 else 1.05)


def test_qsgd_max_norm_has_less_variance_than_l2():
    x = np.random.default_rng(14).standard_normal((64, 64))
    outs = {}
    for norm in (2, float("inf")):
        c = QSGD(levels=16, seed=6, norm=norm, min_compress_size=0)
        outs[norm] = np.mean([(simulate([c], [x], "v") - x) ** 2 for _ in range(50)])
    assert outs[float("inf")] < outs[2] / 3


def test_qsgd_bucket_parameter_in_the_registry():
    c = get_compressor("qsgd:levels=8,bucket=128")
    assert isinstance(c, QSGD) and c.bucket == 128 and c.norm == float("inf")
    assert c.describe() == "qsgd:levels=8,seed=0,bucket=128,norm=inf"
    assert get_compressor(c.describe()).describe() == c.describe()
    assert get_compressor("qsgd:norm=2").norm == 2.0
    assert get_compressor("qsgd").bucket == 512
    with pytest.raises(ValueError, match="bucket must be an int >= 1"):
        get_compressor("qsgd:bucket=0")
    with pytest.raises(ValueError, match="norm must be 2"):
        get_compressor("qsgd:norm=1")
