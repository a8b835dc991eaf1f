"""``decompress_all_into``: top-k's combined result (and error feedback's momentum correction
of it) written into the caller's array has the bits of ``decompress_all``'s new array, step
after step; where it does not apply it returns None and leaves the array alone."""
from __future__ import annotations

import numpy as np
import pytest

from dlcomm.compression import get_compressor
from dlcomm.compression.exchange import SelfComm, run_rounds


def per_rank_payloads(c, step: int, size: int, shape=(40, 30), dtype=np.float32) -> tuple:
    """Rank 0's payloads from ``c`` and its context, plus other ranks' (overlapping picks)."""
    rng = np.random.default_rng([step, 7])
    payloads, ctx = c.compress(rng.standard_normal(shape).astype(dtype), "w")
    others = []
    for _ in range(1, size):
        values = rng.standard_normal(payloads[0].size).astype(dtype)
        indices = np.sort(rng.choice(int(np.prod(shape)), payloads[1].size, replace=False))
        others.append([values, indices.astype(payloads[1].dtype)])
    return [payloads] + others, ctx


@pytest.mark.parametrize("spec", ["topk:ratio=0.05", "topk:ratio=0.05,approx=1",
                                  "topk:ratio=0.05+fp16", "topk:ratio=0.05,ef=0"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("op", ["average", "sum"])
@pytest.mark.parametrize("size", [1, 3, 4])
def test_into_has_the_bits_of_decompress_all_step_after_step(spec, momentum, op, size):
    a, b = (get_compressor(spec, min_compress_size=0) for _ in range(2))
    for c in (a, b):
        c.set_momentum(momentum)
    out = np.full((40, 30), np.nan, np.float32)
    for step in range(5):
        if step == 3:  # the kept state through a checkpoint, as a resumed job has it
            b.load_state_dict(a.state_dict())
        per_rank_a, ctx_a = per_rank_payloads(a, step, size)
        per_rank_b, ctx_b = per_rank_payloads(b, step, size)
        expected = a.decompress_all(per_rank_a, ctx_a, op)
        assert b.decompress_all_into(per_rank_b, ctx_b, op, out) is not None
        assert out.tobytes() == np.ascontiguousarray(expected).tobytes(), step


def test_into_declines_arrays_it_cannot_fill_and_leaves_them_alone():
    c = get_compressor("topk:ratio=0.05", min_compress_size=0)
    per_rank, ctx = per_rank_payloads(c, 0, 2)
    for out in (np.zeros((40, 30), np.float64), np.zeros((30, 40), np.float32),
                np.zeros((40, 60), np.float32)[:, ::2]):
        before = out.copy()
        assert c.decompress_all_into(per_rank, ctx, "average", out) is None
        assert np.array_equal(out, before)
    frozen = np.zeros((40, 30), np.float32)
    frozen.flags.writeable = False
    assert c.decompress_all_into(per_rank, ctx, "average", frozen) is None
    dense = get_compressor("fp16", min_compress_size=0)  # no all-gather: never offered
    payloads, dctx = dense.compress(np.ones((4, 4), np.float32), "d")
    assert dense.decompress_all_into([payloads], dctx, "sum", np.zeros((4, 4))) is None


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_run_rounds_fills_the_given_outputs(momentum):
    """Top-k tensors end in their ``outs`` array (the value returned is it), with the bits
    of a run without; a dense (1-D) tensor and a None entry are untouched."""
    runs = {}
    for with_outs in (False, True):
        c = get_compressor("topk:ratio=0.1", min_compress_size=0)
        c.set_momentum(momentum)
        outs = [np.zeros((20, 10), np.float32), np.zeros(7, np.float32), None]
        values = []
        for step in range(3):
            rng = np.random.default_rng(step)
            items = [(c, rng.standard_normal((20, 10)).astype(np.float32), "a"),
                     (c, rng.standard_normal(7).astype(np.float32), "b"),
                     (c, rng.standard_normal((5, 6)).astype(np.float32), "c")]
            got = run_rounds(items, SelfComm(), True, outs=outs if with_outs else None)
            values.append([np.array(v, copy=True) for v, _ in got])
            if with_outs:
                assert got[0][0] is outs[0] and got[1][0] is not outs[1]
                assert got[2][0] is not None and not np.any(outs[1])
        runs[with_outs] = values
    for old, new in zip(runs[False], runs[True]):
        for x, y in zip(old, new):
            assert x.tobytes() == y.tobytes()
    with pytest.raises(ValueError, match="outs has 1 entries for 2 tensors"):
        c = get_compressor("topk:ratio=0.1", min_compress_size=0)
        run_rounds([(c, np.ones((4, 4), np.float32), "x")] * 2, SelfComm(), True,
                   outs=[None])
