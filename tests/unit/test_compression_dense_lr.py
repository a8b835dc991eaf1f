"""Compressors at the dense learning rate (issue 17): on a quadratic whose curvatures dense
SGD with momentum handles easily, four ranks' compressed gradients, fed to the same
optimizer (momentum applied after the all-reduce, as ``torch.optim.SGD`` does, with the
momentum announced through ``set_momentum`` as the torch adapter does) must drive the loss
down, not up."""
from __future__ import annotations

import numpy as np
import pytest
from compression_reference import simulate

from dlcomm.compression import get_compressor

LR, MU, RANKS, STEPS = 0.2, 0.9, 4, 400
SHAPE = (40, 50)


def quadratic_run(spec: str) -> tuple[float, float]:
    """(initial, final) loss of 0.5 * sum(c * x**2), curvatures c in [0.02, 0.2], when every
    rank's gradient is c * x plus a rank-specific offset that cancels over the ranks."""
    rng = np.random.default_rng(17)
    curvature = rng.uniform(0.02, 0.2, SHAPE)
    x = rng.standard_normal(SHAPE)
    offsets = 0.1 * rng.standard_normal((RANKS, *SHAPE))
    offsets -= offsets.mean(axis=0)
    compressors = [get_compressor(spec, min_compress_size=0) for _ in range(RANKS)]
    for c in compressors:
        c.set_momentum(MU)
    buf = None

    def loss() -> float:
        return float(0.5 * np.sum(curvature * x * x))

    initial = loss()
    for _ in range(STEPS):
        grads = [curvature * x + offsets[r] for r in range(RANKS)]
        d = simulate(compressors, grads, "w")
        buf = d.copy() if buf is None else MU * buf + d
        x = x - LR * buf
        if not np.isfinite(loss()) or loss() > 1e6 * initial:
            break
    return initial, loss()


@pytest.mark.parametrize("spec", ["none", "topk:ratio=0.05", "randomk:ratio=0.05"])
def test_compressed_sgd_descends_at_the_dense_learning_rate(spec):
    initial, final = quadratic_run(spec)
    assert np.isfinite(final) and final < 0.5 * initial, (spec, initial, final)
