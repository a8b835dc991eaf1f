"""``start_iter`` (each tensor's first exchanges dense, DDP's ``start_powerSGD_iter``) and
``mc=0`` (error feedback without momentum correction, the PowerSGD paper's and DDP's hook's
algorithm): four ranks in one process through the reference driver."""
from __future__ import annotations

import numpy as np
import pytest
from compression_reference import simulate

from dlcomm.compression import get_compressor
from dlcomm.compression.dense_start import DenseStart
from dlcomm.compression.error_feedback import ErrorFeedback

RANKS = 4


def grads(step: int, shape: tuple[int, ...] = (24, 30)) -> list[np.ndarray]:
    rng = np.random.default_rng(step)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(RANKS)]


def ranks(spec: str) -> list:
    return [get_compressor(spec, min_compress_size=0) for _ in range(RANKS)]


def test_the_first_start_iter_exchanges_are_the_plain_mean_then_compression_starts_afresh():
    warm, plain = ranks("powersgd:rank=2,start_iter=2"), ranks("powersgd:rank=2")
    for step in range(2):
        g = grads(step)
        np.testing.assert_array_equal(simulate(warm, g, "w"),
                                      np.sum(g, axis=0, dtype=np.float32) / np.float32(RANKS))
        # the inner compressor and its error feedback were not called at all
        assert all(not c.inner.states and not c.inner.inner.states for c in warm)
    for step in range(2, 5):  # then exactly a compressor that starts now
        g = grads(step)
        np.testing.assert_array_equal(simulate(warm, g, "w"), simulate(plain, g, "w"))


def test_the_warm_up_is_counted_per_tensor_and_kept_in_checkpoints():
    spec = "topk:ratio=0.2,start_iter=2"
    a = ranks(spec)
    simulate(a, grads(0), "x")
    assert [c.states for c in a] == [{"x": 1}] * RANKS
    resumed = ranks(spec)
    for c, src in zip(resumed, a):
        c.load_state_dict(src.state_dict())
    fresh = ranks(spec)
    dense = np.sum(grads(1), axis=0, dtype=np.float32) / np.float32(RANKS)
    np.testing.assert_array_equal(simulate(resumed, grads(1), "x"), dense)  # its second
    np.testing.assert_array_equal(simulate(resumed, grads(1), "y"), dense)  # y's first
    assert not np.array_equal(simulate(resumed, grads(2), "x"),  # x compresses now ...
                              np.sum(grads(2), axis=0, dtype=np.float32) / np.float32(RANKS))
    simulate(fresh, grads(1), "x")
    np.testing.assert_array_equal(simulate(fresh, grads(2), "x"),  # ... a fresh one not yet
                                  np.sum(grads(2), axis=0, dtype=np.float32) / np.float32(RANKS))


def test_tensors_that_go_dense_anyway_do_not_use_up_the_warm_up():
    cs = [get_compressor("topk:ratio=0.2,start_iter=1") for _ in range(RANKS)]  # 1-D: dense
    simulate(cs, grads(0, (500,)), "bias")
    assert all(c.states == {} for c in cs)


def test_mc0_is_plain_error_feedback_whatever_the_optimizers_momentum():
    for spec in ("topk:ratio=0.1", "powersgd:rank=2"):
        no_mc, bare, corrected = ranks(f"{spec},mc=0"), ranks(spec), ranks(spec)
        for c in no_mc + corrected:
            c.set_momentum(0.9)
        for c in bare:
            c.set_momentum(0.0)
        differs = False
        for step in range(4):
            g = grads(step)
            out = simulate(no_mc, g, "w")
            np.testing.assert_array_equal(out, simulate(bare, g, "w"))
            differs |= not np.array_equal(out, simulate(corrected, g, "w"))
        assert differs, spec  # momentum correction does change the result
        assert all(c.momentum == 0.0 and not c.velocities for c in no_mc)


def test_specs_build_the_wrappers_describe_round_trips_and_bad_values_are_refused():
    c = get_compressor("powersgd:rank=4,mc=0,start_iter=2+fp16")
    assert isinstance(c, DenseStart) and c.start_iter == 2
    assert isinstance(c.inner, ErrorFeedback) and not c.inner.momentum_correction
    assert get_compressor(c.describe()).describe() == c.describe()
    assert c.describe() == "powersgd:rank=4,seed=0,mc=0,start_iter=2+fp16"
    assert get_compressor("efsignsgd:start_iter=0").describe() == "efsignsgd"
    with pytest.raises(ValueError, match="belongs to error feedback"):
        get_compressor("qsgd:mc=0")
    with pytest.raises(ValueError, match="start_iter must be an int >= 0"):
        get_compressor("topk:start_iter=-1")
    with pytest.raises(ValueError, match="not int"):
        get_compressor("topk:start_iter=2.5")
    with pytest.raises(ValueError, match="start_iter must be"):
        DenseStart(get_compressor("topk"), True)
