"""dlcomm.torch.fl in one process: weights in and out of a module, the strategy's gradient
correction applied by hooks, optimizer steps counted, per-client seeding, and the reference."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dlcomm.fl import ClientContext, GradientCorrection  # noqa: E402
from dlcomm.torch import fl as torch_fl  # noqa: E402


def linear() -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    return m


def test_module_weights_round_trip_and_skip_integer_buffers() -> None:
    m = linear()
    w = torch_fl.module_weights(m)
    assert set(w) == {"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                      "1.running_var"}  # not 1.num_batches_tracked
    w2 = {k: v + 1 for k, v in w.items()}
    torch_fl.load_weights(m, w2)
    np.testing.assert_array_equal(m[0].weight.detach().numpy(), w2["0.weight"])
    with pytest.raises(ValueError, match="no tensor"):
        torch_fl.load_weights(m, {"nope": np.zeros(1, np.float32)})
    with pytest.raises(TypeError, match="torch.nn.Module"):
        torch_fl.module_weights(object())


def test_update_applies_the_correction_and_counts_steps() -> None:
    m = torch.nn.Linear(2, 1, bias=False)
    start = {"weight": np.array([[1.0, 2.0]], np.float32)}
    lr = 0.5

    def train(model, client, ctx):
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for _ in range(3):
            opt.zero_grad()
            (model.weight * 0).sum().backward()  # zero loss gradient: only the correction
            opt.step()
        return 4, {"loss": 0.0}

    update = torch_fl.client_update(m, train)
    corr = GradientCorrection(constant={"weight": np.array([[1.0, -1.0]])})
    ctx = ClientContext(client_id=0, round_index=0, seed=1, correction=corr)
    res = update(0, start, ctx)
    assert res.num_samples == 4 and res.num_steps == 3 and res.metrics == {"loss": 0.0}
    np.testing.assert_allclose(res.weights["weight"], [[1 - 3 * lr, 2 + 3 * lr]])
    # proximal: w <- w - lr * mu (w - anchor), anchor = start, from w = start + 1
    prox = GradientCorrection(prox_mu=0.5, anchor=start)
    res = update(0, {"weight": start["weight"] + 1}, ClientContext(0, 0, 1, prox))
    np.testing.assert_allclose(res.weights["weight"], start["weight"] + 0.75 ** 3)
    # no correction: the hooks add nothing
    res = update(0, start, ClientContext(0, 0, 1, None))
    np.testing.assert_allclose(res.weights["weight"], start["weight"])


def test_each_client_is_seeded_by_its_context() -> None:
    m = torch.nn.Linear(2, 1)

    def train(model, client, ctx):
        with torch.no_grad():
            model.weight.add_(torch.rand(1, 2))  # the default generator, seeded per client
        return 1

    update = torch_fl.client_update(m, train)
    w = torch_fl.module_weights(m)
    a = update(0, w, ClientContext(0, 0, seed=5)).weights["weight"]
    b = update(0, w, ClientContext(0, 0, seed=5)).weights["weight"]
    c = update(0, w, ClientContext(0, 0, seed=6)).weights["weight"]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_reference_trains_a_module() -> None:
    m = torch.nn.Linear(2, 2)
    rng = np.random.default_rng(0)
    xs = torch.from_numpy(rng.normal(size=(6, 8, 2)).astype(np.float32))
    ys = torch.from_numpy(rng.integers(0, 2, (6, 8)))

    def train(model, client, ctx):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xs[client]), ys[client])
        loss.backward()
        opt.step()
        return 8, {"loss": loss.item()}

    before = torch_fl.module_weights(m)
    final, hist = torch_fl.run_reference(m, train, 6, 3, 2, "fedprox:mu=0.1",
                                         metric_names=["loss"])
    assert len(hist) == 2 and all(len(h["clients"]) == 3 for h in hist)
    assert not np.allclose(final["weight"], before["weight"])
    assert final["weight"].dtype == np.float32
