"""dlcomm.fl strategies against aggregates computed by hand: two clients, model w = [1, 2];
client A trained 1 sample for 1 step to [2, 2], client B 3 samples for 2 steps to [1, 6]."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dlcomm.fl import (
    ClientResult,
    FedAvg,
    FedNova,
    FedOpt,
    FedProx,
    GradientCorrection,
    Scaffold,
    available_strategies,
    get_strategy,
)
from dlcomm.fl.client_step import add_into
from dlcomm.fl.strategies.fednova import local_work

W = {"w": np.array([1.0, 2.0])}
A = ClientResult(num_samples=1, weights={"w": np.array([2.0, 2.0])}, num_steps=1)
B = ClientResult(num_samples=3, weights={"w": np.array([1.0, 6.0])}, num_steps=2)


def one_round(strategy, weights, results, states=None, num_clients=4):
    """Aggregate ``results`` as a runner does; returns (new weights, new client states)."""
    if not strategy.num_clients:
        strategy.setup(weights, num_clients)
    sums = {k: np.zeros(s) for k, s in strategy.contribution_layout(weights).items()}
    payload = strategy.payload()
    new_states = []
    for i, r in enumerate(results):
        delta = {n: r.weights[n] - weights[n] for n in weights}
        old = None if states is None else states[i]
        contribution, st = strategy.contribution(weights, payload, delta, r, old)
        add_into(sums, contribution)
        new_states.append(st)
    return strategy.aggregate(weights, sums), new_states


def test_fedavg_is_the_sample_weighted_mean() -> None:
    new, _ = one_round(FedAvg(), W, [A, B])
    # (1*[2,2] + 3*[1,6]) / 4 = [1.25, 5]
    np.testing.assert_allclose(new["w"], [1.25, 5.0])
    new, _ = one_round(FedAvg(weighted=False), W, [A, B])
    np.testing.assert_allclose(new["w"], [1.5, 4.0])
    new, _ = one_round(FedAvg(server_lr=2.0), W, [A, B])
    np.testing.assert_allclose(new["w"], [1.5, 8.0])


def test_no_clients_leaves_the_model_unchanged() -> None:
    for s in (FedAvg(), FedOpt(), FedNova(), Scaffold(client_lr=0.1)):
        new, _ = one_round(s, W, [])
        np.testing.assert_array_equal(new["w"], W["w"])


def test_fedprox_aggregates_as_fedavg_and_corrects_with_the_proximal_gradient() -> None:
    s = FedProx(mu=0.5)
    new, _ = one_round(s, W, [A, B])
    np.testing.assert_allclose(new["w"], [1.25, 5.0])
    corr = s.correction(W, {}, None)
    grads = {"w": np.array([0.0, 1.0])}
    corr.apply({"w": np.array([3.0, 2.0])}, grads)  # + 0.5 * ([3, 2] - [1, 2])
    np.testing.assert_allclose(grads["w"], [1.0, 1.0])
    assert FedProx(mu=0.0).correction(W, {}, None) is None


@pytest.mark.parametrize("optimizer", ["adam", "yogi", "adagrad"])
def test_fedopt_server_step_by_hand(optimizer) -> None:
    s = FedOpt(optimizer=optimizer, eta=0.1, beta1=0.9, beta2=0.99, tau=0.001)
    d = [0.25, 3.0]  # the weighted mean change
    w = [1.0, 2.0]
    m = [0.0, 0.0]
    v = [1e-6, 1e-6]  # tau^2
    weights = W
    for _ in range(2):  # the second round uses the moments the first left
        weights, _ = one_round(s, weights, [
            ClientResult(1, weights={"w": weights["w"] + [1.0, 0.0]}),
            ClientResult(3, weights={"w": weights["w"] + [0.0, 4.0]})])
        for i in range(2):
            m[i] = 0.9 * m[i] + 0.1 * d[i]
            if optimizer == "adam":
                v[i] = 0.99 * v[i] + 0.01 * d[i] ** 2
            elif optimizer == "adagrad":
                v[i] = v[i] + d[i] ** 2
            else:
                v[i] = v[i] - 0.01 * d[i] ** 2 * math.copysign(1.0, v[i] - d[i] ** 2)
            w[i] = w[i] + 0.1 * m[i] / (math.sqrt(v[i]) + 0.001)
        np.testing.assert_allclose(weights["w"], w, rtol=1e-12)


def test_fednova_normalises_by_local_steps() -> None:
    new, _ = one_round(FedNova(), W, [A, B])
    # p = (1/4, 3/4); tau_eff = 1/4*1 + 3/4*2 = 1.75; sum p d/a = [0.25, 0] + [0, 0.75*4/2]
    np.testing.assert_allclose(new["w"], [1.0 + 1.75 * 0.25, 2.0 + 1.75 * 1.5])
    assert local_work(2, 0.5) == pytest.approx((1 - 0.5) / 0.5 + (1 - 0.25) / 0.5)
    assert local_work(7, 0.0) == 7
    with pytest.raises(ValueError, match="num_steps"):
        one_round(FedNova(), W, [ClientResult(1, weights=A.weights)])


def test_scaffold_control_variates_by_hand() -> None:
    s = Scaffold(client_lr=0.1)
    new, states = one_round(s, W, [A, B], num_clients=4)
    np.testing.assert_allclose(new["w"], [1.25, 5.0])
    # c_A = -[1, 0] / (1 * 0.1); c_B = -[0, 4] / (2 * 0.1); c = (c_A + c_B) / 4
    np.testing.assert_allclose(states[0]["w"], [-10.0, 0.0])
    np.testing.assert_allclose(states[1]["w"], [0.0, -20.0])
    np.testing.assert_allclose(s.c["w"], [-2.5, -5.0])
    corr = s.correction(new, s.payload(), states[0])
    np.testing.assert_allclose(corr.constant["w"], [7.5, -5.0])  # c - c_A
    # Round 2, client A again (no change): c_A+ = c_A - c + 0 = [-7.5, 5]
    _, states2 = one_round(s, new, [ClientResult(1, weights=new, num_steps=1)], [states[0]])
    np.testing.assert_allclose(states2[0]["w"], [-7.5, 5.0])
    np.testing.assert_allclose(s.c["w"], [-2.5 + 2.5 / 4, -5.0 + 5.0 / 4])


def test_gradient_correction_adds_constant_and_proximal_parts() -> None:
    corr = GradientCorrection(constant={"w": np.array([1.0, -1.0])}, prox_mu=2.0,
                              anchor={"w": np.array([0.0, 0.0])})
    np.testing.assert_allclose(corr.term("w", np.array([1.0, 1.0])), [3.0, 1.0])
    assert corr.term("other", np.zeros(2)) is None


def test_registry_parses_specs_and_rejects_bad_ones() -> None:
    assert available_strategies() == ["fedavg", "fednova", "fedopt", "fedprox", "scaffold"]
    s = get_strategy("fedopt:optimizer=yogi,eta=0.03")
    assert isinstance(s, FedOpt) and s.optimizer == "yogi" and s.eta == 0.03
    assert get_strategy("fedprox:mu=0.1").mu == 0.1
    assert get_strategy("fedavg:weighted=0").weighted is False
    with pytest.raises(ValueError, match="unknown strategy"):
        get_strategy("fedsgd")
    with pytest.raises(ValueError, match="bad parameter"):
        get_strategy("fedprox:nu=1")
    with pytest.raises(ValueError, match="must be one of"):
        get_strategy("fedopt:optimizer=sgd")
    with pytest.raises(ValueError, match="client_lr"):
        get_strategy("scaffold")
    with pytest.raises(TypeError):
        get_strategy(3)
