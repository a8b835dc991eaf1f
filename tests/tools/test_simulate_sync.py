"""DS-Sync, LB-BSP and DLCP in the simulator, and the traces that drive them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dlcomm.tools.simulate.devices import get_device
from dlcomm.tools.simulate.methods import Method
from dlcomm.tools.simulate.model_zoo import describe, workload_from_description
from dlcomm.tools.simulate.network import Network, Topology, preset_params
from dlcomm.tools.simulate.predict import predict
from dlcomm.tools.simulate.sync_methods import ramp_intervals
from dlcomm.tools.simulate.traces import CongestionTrace, StragglerTrace

GPU = get_device("v100")


def setup(model: str = "resnet50", workers: int = 16, slots: int = 1, network: str = "10gbe",
          oversubscription: float = 1.0):
    w = workload_from_description(describe(model), 64, GPU)
    return w, Network(Topology.for_workers(workers, slots, oversubscription),
                      preset_params(network))


def test_dssync_with_one_group_is_bsp() -> None:
    w, net = setup(workers=8)
    bsp = predict(w, Method.parse("dense"), net, GPU)
    one_group = predict(w, Method.parse("dssync:group_size=8"), net, GPU)
    assert one_group.iteration_s == bsp.iteration_s


def test_dssync_pairs_send_less_and_win_when_the_network_is_the_bottleneck() -> None:
    w, net = setup("bert-base", workers=64, oversubscription=4)
    bsp = predict(w, Method.parse("dense"), net, GPU)
    pairs = predict(w, Method.parse("dssync:group_size=2"), net, GPU)
    assert pairs.link_bytes < bsp.link_bytes
    assert pairs.iteration_s < bsp.iteration_s
    # the group average does not overlap backward: it costs at least compute + the pair
    assert pairs.iteration_s > w.compute_s
    every = predict(w, Method.parse("dssync:group_size=2"), net, GPU, global_every=10)
    assert every.iteration_s > pairs.iteration_s


def test_lbbsp_without_stragglers_is_bsp() -> None:
    w, net = setup(workers=4)
    bsp = predict(w, Method.parse("dense"), net, GPU)
    lb = predict(w, Method.parse("lbbsp"), net, GPU, iterations=40)
    assert lb.iteration_s == pytest.approx(bsp.iteration_s)
    assert sorted(set(lb.details["batch_sizes"])) == [64]


def test_lbbsp_moves_samples_off_a_straggler() -> None:
    w, net = setup(workers=4)
    trace = StragglerTrace.constant(4, {1: 0.5})
    bsp = predict(w, Method.parse("dense"), net, GPU, stragglers=trace, iterations=60)
    lb = predict(w, Method.parse("lbbsp"), net, GPU, stragglers=trace, iterations=60)
    batches = lb.details["batch_sizes"]
    assert sum(batches) == 4 * 64 and batches[1] < min(b for i, b in enumerate(batches) if i != 1)
    assert lb.iteration_s < bsp.iteration_s
    # BSP waits for the straggler: forward and backward at half speed
    assert bsp.iteration_s >= w.compute_s + w.forward_s + w.backward_s - 1e-12


def test_dlcp_without_congestion_loses_nothing_and_congestion_slows_everyone() -> None:
    w, net = setup("vgg16", workers=8)
    steady = predict(w, Method.parse("loss_tolerance=0.1"), net, GPU, iterations=30)
    assert steady.details["lost_fraction"] == 0.0
    trace = CongestionTrace.from_heterogeneity("congest=*:1gbit:0.5:2,seed=3", 8, "10gbit",
                                               horizon_s=300)
    congested = predict(w, Method.parse("loss_tolerance=0.1"), net, GPU, congestion=trace,
                        iterations=60)
    lossless = predict(w, Method.parse("dense"), net, GPU, congestion=trace, iterations=60)
    quiet = predict(w, Method.parse("dense"), net, GPU)
    assert congested.iteration_s > steady.iteration_s
    assert lossless.iteration_s > quiet.iteration_s
    # dlcomm drops whole chunks of unprotected tensors only, never more than p of them
    assert 0.0 <= congested.details["lost_fraction"] <= 0.1


def test_mean_slowest_rate_by_hand() -> None:
    trace = CongestionTrace(3, 1e9, ((), ((1.0, 1.0, 1e8),), ((1.5, 2.0, 5e8),)))
    assert trace.mean_slowest_rate(0.0, 1.0) == pytest.approx(1e9)
    assert trace.mean_slowest_rate(0.5, 1.5) == pytest.approx((0.5 * 1e9 + 0.5 * 1e8) / 1.0)
    # [1, 2): host 1 at 1e8; [2, 3.5): host 2 at 5e8; then the base rate
    assert trace.mean_slowest_rate(1.0, 4.0) == pytest.approx((1e8 + 1.5 * 5e8 + 0.5 * 1e9) / 3)
    assert trace.mean_slowest_rate(1.2, 1.2) == 1e8  # an empty window: the rate there


def test_congested_bsp_drains_the_bytes_at_the_rate_of_each_moment() -> None:
    """A burst inside an iteration costs the bytes it did not move, not a whole iteration
    at the burst's rate (the emulator's links slow down and recover mid-exchange)."""
    from dlcomm.tools.simulate.network import CostParams
    from dlcomm.tools.simulate.workload import Layer, Tensor, Workload

    base = 1e9
    w = Workload("one", 8, (Layer("fc", 0.0, 0.0, (Tensor("w", (25_000_000,)),)),), 0.0)
    net = Network(Topology(2), CostParams(beta=8.0 / base))
    dense = Method.parse("dense", algorithm="ring")
    quiet = predict(w, dense, net, GPU).iteration_s  # all of it on the wire: 100 MB / 2
    burst = CongestionTrace(2, base, ((), ((0.1, 0.2, 1e8),)))  # inside the first iteration
    first = predict(w, dense, net, GPU, congestion=burst, iterations=1).iteration_s
    # 0.2 s at a tenth of the rate moves 0.18 s' worth of bytes less
    assert first == pytest.approx(quiet + 0.2 * (1 - 0.1), rel=2e-3)
    always = CongestionTrace(2, base, ((), ((0.0, 1e6, 1e8),)))
    slow = predict(w, dense, net, GPU, congestion=always, iterations=3).iteration_s
    assert slow == pytest.approx(10 * quiet, rel=2e-3)
    steady = predict(w, dense, net, GPU, congestion=CongestionTrace.steady(2, base),
                     iterations=3).iteration_s
    assert steady == pytest.approx(quiet)


def test_traces_are_seeded_and_shaped() -> None:
    a = StragglerTrace.markov_stragglers(16, 100, slow_fraction=0.25, seed=2)
    b = StragglerTrace.markov_stragglers(16, 100, slow_fraction=0.25, seed=2)
    c = StragglerTrace.markov_stragglers(16, 100, slow_fraction=0.25, seed=3)
    assert a == b and a != c and a.workers == 16
    slow = np.mean(np.array(a.speeds) < 1)
    assert 0.05 < slow < 0.6
    assert a.at(10_000) == a.speeds[-1]
    with pytest.raises(ValueError, match="outside"):
        StragglerTrace.constant(4, {4: 0.5})
    with pytest.raises(ValueError, match="every worker"):
        StragglerTrace(((1.0, 1.0), (1.0,)))


def test_traces_follow_the_emulators_draws(tmp_path: Path) -> None:
    from dlcomm.tools.emulation.compute_slowdown import ComputeStraggler, compute_speeds

    trace = StragglerTrace.from_heterogeneity("compute=1:0.5:0.2,seed=4", hosts=2,
                                              slots_per_host=2, iterations=20)
    expected = compute_speeds(ComputeStraggler(1, 0.5, 0.2), 4, 20)
    assert [row[2] for row in trace.speeds] == pytest.approx(list(expected))
    assert [row[3] for row in trace.speeds] == pytest.approx(list(expected))
    assert all(row[0] == 1.0 for row in trace.speeds)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace.to_dict()))
    assert StragglerTrace.load(path) == trace
    congestion = CongestionTrace.from_heterogeneity("congest=1:100mbit:1:3,seed=1", 2,
                                                    "1gbit", horizon_s=100)
    assert congestion.periods[0] == () and congestion.periods[1]
    start, duration, rate = congestion.periods[1][0]
    assert congestion.rate(1, start + duration / 2) == rate == 1e8
    assert congestion.rate(0, start + duration / 2) == 1e9
    with pytest.raises(ValueError, match="no congest"):
        CongestionTrace.from_heterogeneity("compute=1:0.5", 2, "1gbit", 10)


def test_lbbsp_ramp_matches_the_balancer() -> None:
    ramp = ramp_intervals(8)
    assert [next(ramp) for _ in range(6)] == [2, 4, 8, 8, 8, 8]
    ramp = ramp_intervals(1)
    assert [next(ramp) for _ in range(3)] == [1, 1, 1]
