"""Compressor state in checkpoints (issue 27): ``state_dict``/``load_state_dict`` carry every
piece of state that affects the next step, so fresh compressors loaded from a snapshot give
bit for bit what the uninterrupted ones give."""
from __future__ import annotations

import numpy as np
import pytest
from compression_reference import simulate

from dlcomm.compression import get_compressor

SPECS = ["none", "topk:ratio=0.1", "randomk:ratio=0.1", "randomk:ratio=0.1,ef=1",
         "gtopk:ratio=0.1", "efsignsgd", "qsgd:levels=4", "powersgd:rank=2",
         "acpsgd:rank=2", "powersgd:rank=2+fp16", "topk:ratio=0.1+bf16"]
RANKS = 3


def grads(step: int) -> list:
    return [np.random.default_rng([r, step, 27]).standard_normal((12, 10)).astype(np.float32)
            for r in range(RANKS)]


def build(spec: str) -> list:
    out = [get_compressor(spec, min_compress_size=0) for _ in range(RANKS)]
    for c in out:
        c.set_momentum(0.9)
    return out


@pytest.mark.parametrize("spec", SPECS)
def test_resumed_compressors_match_the_uninterrupted_ones_bit_for_bit(spec):
    running = build(spec)
    for step in range(3):
        simulate(running, grads(step), "w")
    snapshots = [c.state_dict() for c in running]
    resumed = build(spec)
    for c, snap in zip(resumed, snapshots):
        c.load_state_dict(snap)
    for step in range(3, 7):
        np.testing.assert_array_equal(simulate(resumed, grads(step), "w"),
                                      simulate(running, grads(step), "w"))


def test_a_snapshot_is_a_copy_not_a_view():
    cs = build("topk:ratio=0.1")
    simulate(cs, grads(0), "w")
    snap = cs[0].state_dict()
    before = snap["states"]["w"].copy()
    simulate(cs, grads(1), "w")
    np.testing.assert_array_equal(snap["states"]["w"], before)
    assert not np.array_equal(cs[0].residual("w"), before)


@pytest.mark.parametrize("saved, loaded", [("topk:ratio=0.1", "topk:ratio=0.2"),
                                           ("powersgd:rank=2", "acpsgd:rank=2"),
                                           ("randomk:ratio=0.1,ef=1", "randomk:ratio=0.1")])
def test_loading_another_compressors_state_raises(saved, loaded):
    snap = get_compressor(saved).state_dict()
    with pytest.raises(ValueError, match="build the same compressor|no 'inner' part"):
        get_compressor(loaded).load_state_dict(snap)


def test_loading_something_else_raises():
    with pytest.raises(ValueError, match="state_dict"):
        get_compressor("none").load_state_dict({"w": 1})
