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
                 coll.bruck_allgather(N, one), coll.gtopk_merge_tree(N, one),
                 coll.ordered_allreduce(N, one), coll.ordered_reduce_scatter(N, one)):
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


# --- ordered: all-to-all + reduction in rank order + all-gather (dlcomm's default) ---------

A_L, B_L = 2e-6, 1e-10  # in-host message and byte
FULL = CostParams(overhead=1e-4, alpha=ALPHA, beta=BETA, gamma=GAMMA, alpha_local=A_L,
                  beta_local=B_L)
# 1_000_001 float32 elements (4_000_004 bytes), split as equal_counts splits them: the
# largest block has ceil(1_000_001 / p) elements.
ODD = 4_000_004.0
LARGEST = {2: 4 * 500_001, 3: 4 * 333_334, 4: 4 * 250_001, 5: 4 * 200_001}


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_ordered_flat_closed_form_for_sizes_not_divisible_by_p(p: int) -> None:
    block = LARGEST[p]
    cost = coll.ordered_allreduce(ODD, flat(p))
    # all-to-all: p - 1 messages of the largest block; the slowest rank sums p - 1 copies
    # of it; all-gather (ring): p - 1 messages of the largest block
    expected = (1e-4 + (p - 1) * (ALPHA + block * BETA) + (p - 1) * block * GAMMA
                + (p - 1) * (ALPHA + block * BETA))
    assert cost.seconds(FULL) == pytest.approx(expected, rel=1e-12)
    assert cost.link_bytes == pytest.approx(2 * (p - 1) * block)
    assert coll.allreduce("ordered", ODD, flat(p)).seconds(FULL) == cost.seconds(FULL)
    rs = coll.ordered_reduce_scatter(ODD, flat(p))
    assert rs.seconds(FULL) == pytest.approx(
        1e-4 + (p - 1) * (ALPHA + block * BETA) + (p - 1) * block * GAMMA, rel=1e-12)
    assert rs.link_bytes == pytest.approx((p - 1) * block)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_ordered_small_buffers_are_gathered_whole(p: int) -> None:
    n = 4 * 1001.0  # 1001 elements: not divisible by 2, 3, 4 or 5; p copies <= 64 KiB
    expected = 1e-4 + (p - 1) * (ALPHA + n * BETA) + (p - 1) * n * GAMMA
    cost = coll.ordered_allreduce(n, flat(p))
    assert cost.seconds(FULL) == pytest.approx(expected, rel=1e-12)
    assert cost.alpha == p - 1 and cost.link_bytes == pytest.approx((p - 1) * n)


def test_ordered_switches_path_where_the_library_does() -> None:
    # p copies of 16 KiB fill 64 KiB exactly: still one all-gather
    small = coll.ordered_allreduce(16384.0, flat(4))
    assert (small.alpha, small.beta, small.gamma) == (3, 3 * 16384.0, 3 * 16384.0)
    # one element more: all-to-all, then all-gather of ceil(4097 / 4) = 1025 elements
    large = coll.ordered_allreduce(16388.0, flat(4))
    assert (large.alpha, large.beta, large.gamma) == (6, 6 * 4100.0, 3 * 4100.0)
    assert coll.ORDERED_SMALL_GATHER_BYTES == 64 * 1024


def test_ordered_constants_mirror_the_library() -> None:
    # the library's collectives start MPI when imported: only in the test that compares
    from dlcomm.collectives.chunking import equal_counts
    from dlcomm.collectives.ordered import SMALL_GATHER_BYTES

    assert coll.ORDERED_SMALL_GATHER_BYTES == SMALL_GATHER_BYTES
    for p, block in LARGEST.items():
        assert max(equal_counts(1_000_001, p)) * 4 == block


def test_ordered_itemsize_sets_the_block() -> None:
    # 2-byte elements: 2_000_002 elements of 4_000_004 bytes, ceil(/3) = 666_668 elements
    cost = coll.ordered_reduce_scatter(ODD, flat(3), itemsize=2)
    assert cost.beta == pytest.approx(2 * 2 * 666_668)
    with pytest.raises(ValueError, match="itemsize"):
        coll.ordered_allreduce(ODD, flat(3), itemsize=0)


def _alltoall_by_enumeration(topo: Topology) -> tuple[int, int, int]:
    """(steps crossing hosts, steps inside hosts, sum over steps of the ranks of one host
    that cross): the pairwise exchange rank by rank, every host checked alike."""
    p, s = topo.workers, topo.slots_per_host
    crossing_steps = local_steps = shared = 0
    for k in range(1, p):
        per_host = {sum((r + k) % p // s != host for r in range(host * s, (host + 1) * s))
                    for host in range(topo.hosts)}
        assert len(per_host) == 1  # the same on every host
        crossing = per_host.pop()
        crossing_steps += crossing > 0
        local_steps += crossing == 0
        shared += crossing
    return crossing_steps, local_steps, shared


@pytest.mark.parametrize("hosts,slots", [(2, 2), (3, 2), (2, 3), (4, 2), (5, 3), (1, 4),
                                         (3, 1), (8, 4)])
def test_ordered_multi_host_alltoall_shares_the_host_link(hosts: int, slots: int) -> None:
    topo = Topology(hosts, slots)
    p = topo.workers
    n = 4.0 * (10 * p + 3)  # 10 p + 3 elements: the largest block has 11
    block = 44.0
    crossing_steps, local_steps, shared = _alltoall_by_enumeration(topo)
    assert shared == slots * (p - slots)  # every block for another host crosses once
    rs = coll.ordered_reduce_scatter(n, topo)
    assert (rs.alpha, rs.alpha_local) == (crossing_steps, local_steps)
    assert rs.beta == pytest.approx(shared * block)
    assert rs.link_bytes == pytest.approx(shared * block)
    assert rs.gamma == pytest.approx((p - 1) * block)
    ring_ag = coll.ring_allgather(block, topo)
    ar = coll.ordered_allreduce(n * 1000, topo)  # large path
    big = 4.0 * math.ceil((10 * p + 3) * 1000 / p)
    halves = coll.ordered_reduce_scatter(n * 1000, topo) + coll.ring_allgather(big, topo)
    assert ar.seconds(FULL) == pytest.approx(halves.seconds(FULL) - 1e-4)  # one call
    assert ring_ag.alpha + ring_ag.alpha_local == p - 1


def test_ordered_two_hosts_of_two_by_hand() -> None:
    # ranks 0,1 on host 0 and 2,3 on host 1. Step 1: 1->2 and 3->0 cross (one rank per
    # host); step 2: 0->2, 1->3 (both); step 3: 0->3 and 2->1 (one). The ring all-gather
    # crosses at every step with one rank per host.
    block = 4 * 250_001
    cost = coll.ordered_allreduce(ODD, Topology(2, 2))
    expected = (1e-4 + 3 * ALPHA + (1 + 2 + 1) * block * BETA + 3 * block * GAMMA
                + 3 * (ALPHA + block * BETA))
    assert cost.seconds(FULL) == pytest.approx(expected, rel=1e-12)
    over = coll.ordered_allreduce(ODD, Topology(2, 2, oversubscription=2))
    assert over.beta == pytest.approx(2 * cost.beta) and over.alpha == cost.alpha
    # one host: every step in shared memory
    one = coll.ordered_allreduce(ODD, Topology(1, 4))
    assert one.seconds(FULL) == pytest.approx(
        1e-4 + 6 * (A_L + block * B_L) + 3 * block * GAMMA, rel=1e-12)
    assert one.link_bytes == 0.0


def test_ordered_equals_the_ring_on_flat_topologies_when_p_divides_the_buffer() -> None:
    for p in (2, 4, 5, 8):
        n = 4.0 * 1000 * p * 7
        assert coll.ordered_allreduce(n, flat(p)).coefficients() == pytest.approx(
            coll.ring_allreduce(n, flat(p)).coefficients())


def test_ordered_empty_buffers_and_one_rank() -> None:
    assert coll.ordered_allreduce(0.0, flat(4)).seconds(FULL) == 1e-4  # the call only
    assert coll.ordered_reduce_scatter(0.0, flat(4)).seconds(FULL) == 1e-4
    assert coll.ordered_allreduce(ODD, Topology(1)).seconds(FULL) == 0.0
    assert coll.ordered_reduce_scatter(ODD, Topology(1)).seconds(FULL) == 0.0


def test_bad_arguments_say_what_to_change() -> None:
    with pytest.raises(ValueError, match="'mpi' or 'native'"):
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
