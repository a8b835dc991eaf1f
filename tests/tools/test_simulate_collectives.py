"""The simulator's network model: closed-form collective costs, monotonicity, linearity."""
from __future__ import annotations

import math

import pytest

from dlcomm.tools.simulate import collectives as coll
from dlcomm.tools.simulate.network import (
    PARAM_NAMES,
    Cost,
    CostParams,
    Network,
    Topology,
    parse_rate,
    preset_params,
)

ALPHA, BETA, GAMMA = 3e-5, 8e-9, 1e-9
PARAMS = CostParams(alpha=ALPHA, beta=BETA, gamma=GAMMA)
N = 10_000_000.0  # bytes


def flat(p: int) -> Topology:
    return Topology(p)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 7, 8, 16, 1024])
def test_ring_closed_form(p: int) -> None:
    # issue 26: ring time = 2(P-1)/P * n/B + 2(P-1) alpha (plus the reduction)
    bandwidth = 1 / BETA
    expected = 2 * (p - 1) / p * N / bandwidth + 2 * (p - 1) * ALPHA + (p - 1) / p * N * GAMMA
    assert coll.ring_allreduce(N, flat(p)).seconds(PARAMS) == pytest.approx(expected, rel=1e-12)
    no_gamma = CostParams(alpha=ALPHA, beta=BETA)
    assert coll.ring_allreduce(N, flat(p)).seconds(no_gamma) == pytest.approx(
        2 * (p - 1) / p * N / bandwidth + 2 * (p - 1) * ALPHA, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8, 64])
def test_rhd_power_of_two(p: int) -> None:
    lg = math.log2(p)
    expected = 2 * lg * ALPHA + 2 * (p - 1) / p * N * BETA + (p - 1) / p * N * GAMMA
    assert coll.rhd_allreduce(N, flat(p)).seconds(PARAMS) == pytest.approx(expected)


@pytest.mark.parametrize("p", [3, 5, 6, 7, 12])
def test_rhd_other_counts_fold_first(p: int) -> None:
    p2 = 1 << (p.bit_length() - 1)
    lg = math.log2(p2)
    expected = ((2 * lg + 2) * ALPHA + (2 * (p2 - 1) / p2 + 2) * N * BETA
                + ((p2 - 1) / p2 + 1) * N * GAMMA)
    assert coll.rhd_allreduce(N, flat(p)).seconds(PARAMS) == pytest.approx(expected)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 9])
def test_tree_closed_form(p: int) -> None:
    lg = math.ceil(math.log2(p))
    expected = 2 * lg * ALPHA + 2 * lg * N * BETA + lg * N * GAMMA
    assert coll.tree_allreduce(N, flat(p)).seconds(PARAMS) == pytest.approx(expected)


@pytest.mark.parametrize("hosts,slots", [(2, 2), (4, 8), (128, 8), (3, 4), (5, 1)])
def test_hierarchical_closed_form(hosts: int, slots: int) -> None:
    params = CostParams(alpha=ALPHA, beta=BETA, gamma=GAMMA, alpha_local=2e-6, beta_local=1e-10)
    ll = math.ceil(math.log2(slots)) if slots > 1 else 0
    expected = (2 * ll * 2e-6 + 2 * (hosts - 1) * ALPHA
                + 2 * ll * N * 1e-10 + 2 * (hosts - 1) / hosts * N * BETA
                + ll * N * GAMMA + (hosts - 1) / hosts * N * GAMMA)
    cost = coll.hierarchical_allreduce(N, Topology(hosts, slots))
    assert cost.seconds(params) == pytest.approx(expected)
    # only the leaders' ring crosses the network
    assert cost.link_bytes == pytest.approx(2 * (hosts - 1) / hosts * N)


def test_flat_ring_over_hosts_is_bounded_by_the_link_between_hosts() -> None:
    params = CostParams(alpha=ALPHA, beta=BETA, alpha_local=0.0, beta_local=0.0)
    p = 8
    cost = coll.ring_allreduce(N, Topology(2, 4))
    assert cost.seconds(params) == pytest.approx(2 * (p - 1) * ALPHA + 2 * (p - 1) / p * N * BETA)
    one_host = coll.ring_allreduce(N, Topology(1, 8))
    assert one_host.seconds(params) == 0.0 and one_host.link_bytes == 0.0


def test_halves_of_dear_cost_what_the_ring_costs() -> None:
    for topo in (flat(4), flat(7), Topology(4, 2)):
        rs = coll.ring_reduce_scatter(N, topo)
        ag = coll.ring_allgather(N / topo.workers, topo)
        ring = coll.ring_allreduce(N, topo)
        assert (rs + ag).seconds(PARAMS) == pytest.approx(
            ring.seconds(PARAMS) + PARAMS.overhead)  # one more call
        assert (rs + ag).link_bytes == pytest.approx(ring.link_bytes)


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8, 33])
def test_allgather_ring_and_bruck(p: int) -> None:
    m = 12345.0
    ring = coll.ring_allgather(m, flat(p))
    assert ring.seconds(PARAMS) == pytest.approx((p - 1) * (ALPHA + m * BETA))
    bruck = coll.bruck_allgather(m, flat(p))
    assert bruck.alpha == math.ceil(math.log2(p))
    assert bruck.beta == pytest.approx((p - 1) * m)  # the same bytes, fewer start-ups


@pytest.mark.parametrize("p,rounds", [(2, 1), (4, 2), (8, 3), (1024, 10), (5, 4), (12, 5)])
def test_gtopk_tree_rounds(p: int, rounds: int) -> None:
    pair = 800.0
    cost = coll.gtopk_merge_tree(pair, flat(p))
    assert cost.alpha == rounds
    assert cost.beta == pytest.approx(rounds * pair)


def test_one_rank_costs_nothing() -> None:
    one = Topology(1)
    for cost in (coll.ring_allreduce(N, one), coll.rhd_allreduce(N, one),
                 coll.tree_allreduce(N, one), coll.hierarchical_allreduce(N, one),
                 coll.ring_reduce_scatter(N, one), coll.ring_allgather(N, one),
                 coll.bruck_allgather(N, one), coll.gtopk_merge_tree(N, one)):
        assert cost.seconds(CostParams(overhead=1, alpha=1, beta=1, gamma=1)) == 0


def test_overhead_is_counted_once_per_call() -> None:
    params = CostParams(overhead=1e-3)
    for algorithm in coll.ALLREDUCE_ALGORITHMS:
        assert coll.allreduce(algorithm, N, Topology(4, 2)).seconds(params) == 1e-3


def test_oversubscription_multiplies_only_the_bytes_between_hosts() -> None:
    base = coll.ring_allreduce(N, Topology(8, 1))
    over = coll.ring_allreduce(N, Topology(8, 1, oversubscription=4))
    assert over.beta == pytest.approx(4 * base.beta) and over.alpha == base.alpha
    local = coll.hierarchical_allreduce(N, Topology(1, 8, oversubscription=4))
    assert local.beta == 0.0


def test_cost_is_a_linear_form() -> None:
    cost = coll.hierarchical_allreduce(N, Topology(4, 4), "rhd")
    params = CostParams(overhead=1e-4, alpha=2e-5, beta=3e-9, gamma=4e-10, alpha_local=5e-6,
                        beta_local=6e-11)
    dot = sum(c * getattr(params, n) for c, n in zip(cost.coefficients(), PARAM_NAMES))
    assert cost.seconds(params) == pytest.approx(dot)
    assert (cost + cost).seconds(params) == pytest.approx(cost.times(2).seconds(params))


@pytest.mark.parametrize("algorithm", coll.ALLREDUCE_ALGORITHMS)
@pytest.mark.parametrize("topo", [Topology(8), Topology(4, 4), Topology(3, 2), Topology(1, 4)])
def test_more_bandwidth_or_fewer_bytes_is_never_slower(algorithm: str, topo: Topology) -> None:
    slow = CostParams(alpha=ALPHA, beta=8e-9, beta_local=1e-10)
    fast = CostParams(alpha=ALPHA, beta=8e-10, beta_local=1e-11)
    for n in (0.0, 1e3, 1e6, 1e8):
        c = coll.allreduce(algorithm, n, topo)
        assert c.seconds(fast) <= c.seconds(slow)
        assert coll.allreduce(algorithm, n / 2, topo).seconds(slow) <= c.seconds(slow)


def test_more_workers_never_cut_the_ring_latency() -> None:
    times = [coll.ring_allreduce(N, flat(p)).seconds(PARAMS) for p in (2, 4, 8, 16, 32)]
    assert times == sorted(times)


def test_bad_arguments_say_what_to_change() -> None:
    with pytest.raises(ValueError, match="native"):
        coll.allreduce("native", N, flat(4))
    with pytest.raises(ValueError, match="bytes"):
        coll.ring_allreduce(-1.0, flat(4))
    with pytest.raises(ValueError, match="leader_algorithm"):
        coll.hierarchical_allreduce(N, Topology(2, 2), "hierarchical")
    with pytest.raises(ValueError, match="slots"):
        Topology.for_workers(10, 4)
    with pytest.raises(ValueError, match="oversubscription"):
        Topology(4, 1, 0.5)
    with pytest.raises(ValueError, match=">= 0"):
        CostParams(alpha=-1.0)
    with pytest.raises(ValueError, match="unknown cost parameters"):
        CostParams.from_dict({"latency": 1.0})


def test_rates_and_presets() -> None:
    assert parse_rate("1gbit") == 1e9 and parse_rate("500mbit") == 5e8
    assert parse_rate(2.5e9) == 2.5e9
    with pytest.raises(ValueError, match="gbit"):
        parse_rate("10gbps")
    p = preset_params("10gbe")
    assert p.beta == pytest.approx(8 / 10e9) and p.alpha > 0
    assert preset_params("40gbit").beta == pytest.approx(8 / 40e9)
    with pytest.raises(ValueError, match="preset"):
        preset_params("carrier-pigeon")
    net = Network(Topology(4), p)
    assert net.workers == 4 and net.with_params(alpha=0.0).params.alpha == 0.0
    assert Cost().seconds(p) == 0.0
