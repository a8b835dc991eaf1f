"""Cost of each collective dlcomm runs, as a ``Cost`` (a linear form over the parameters).

The formulas follow dlcomm's own algorithms (docs/collectives.md): ``ordered`` (an
all-to-all, a reduction in rank order and an all-gather, or one all-gather of whole buffers
when they are small, through MPI), ``ordered_tcp`` (the same messages over dlcomm's TCP
mesh, every peer's at once; the engine's default, ``auto``, picks it or ``ordered`` by
size: ``MessageModel``), ring, recursive halving-doubling
(Rabenseifner, with the fold for non-powers of two), binomial tree (reduce + broadcast),
hierarchical (tree inside a host, a flat algorithm among host leaders), ring and ordered
reduce-scatter and the all-gather (DeAR's halves), all-gather of unequal payloads (top-k,
sign methods), gTop-k's recursive-doubling merge tree and the all-gather among peers (one
rank per host, htopk's PEER round).

Placement: ranks fill hosts in order. A step whose partners sit on one host costs
``alpha_local + bytes * beta_local``; one that crosses hosts costs ``alpha + bytes * beta``,
with ``bytes`` multiplied by the number of the host's ranks that cross at the same time
(they share its link) and by the topology's oversubscription. A ring step moves one block
over every edge at once, and the slowest edge (between hosts, whenever there are several)
sets its time. ``n`` is always bytes per rank; ``overhead`` is counted once per call.
``link_bytes`` counts what one host's network link carries (each direction).
"""
from __future__ import annotations

import math
from collections.abc import Callable

from dlcomm.tools.simulate.network import ZERO_COST, Cost, Topology

ALLREDUCE_ALGORITHMS = ("ordered", "ordered_tcp", "ring", "rhd", "tree", "hierarchical")
FLAT_ALGORITHMS = ("ring", "rhd", "tree")
# dlcomm.collectives.ordered.SMALL_GATHER_BYTES (mirrored: importing the library's
# collectives starts MPI; a test checks they agree): an all-reduce whose p copies of the
# buffer fit in this many bytes all-gathers them whole.
ORDERED_SMALL_GATHER_BYTES = 64 * 1024
# Bytes per element when ``ordered`` splits a buffer into blocks of whole elements (float32).
DEFAULT_ITEMSIZE = 4


def _check_bytes(n: float) -> float:
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n < 0:
        raise ValueError(f"message size must be a finite number of bytes >= 0, got {n!r}")
    return float(n)


def _log2_ceil(p: int) -> int:
    return (p - 1).bit_length() if p > 1 else 0


def _crosses(topo: Topology, distance: int) -> bool:
    """Whether some pair of ranks ``distance`` apart in an aligned exchange (partner =
    rank xor distance, or a binomial tree's 2^k) sits on two hosts."""
    return topo.hosts > 1 and topo.slots_per_host % (2 * distance) != 0


def link_step(nbytes: float, topo: Topology, *, crosses: bool, sharing: int = 1) -> Cost:
    """One message of ``nbytes`` from every active rank: within a host, or between hosts
    with ``sharing`` ranks of a host on its link at once."""
    if not crosses:
        return Cost(alpha_local=1.0, beta_local=nbytes)
    return Cost(alpha=1.0, beta=nbytes * sharing * topo.oversubscription,
                link_bytes=nbytes * sharing)


def _exchange_step(nbytes: float, topo: Topology, distance: int) -> Cost:
    """Every rank exchanges ``nbytes`` with the rank ``distance`` away (rhd, gTop-k)."""
    crosses = _crosses(topo, distance)
    sharing = topo.slots_per_host if crosses and distance >= topo.slots_per_host else 1
    return link_step(nbytes, topo, crosses=crosses, sharing=sharing)


def _tree_step(nbytes: float, topo: Topology, distance: int) -> Cost:
    """One round of a binomial tree: at most one sender per host crosses (the tree's
    senders in a round are ``2 * distance`` ranks apart)."""
    return link_step(nbytes, topo, crosses=_crosses(topo, distance))


def _ring_step(nbytes: float, topo: Topology) -> Cost:
    return link_step(nbytes, topo, crosses=topo.hosts > 1)


def _alltoall(block: float, topo: Topology) -> Cost:
    """Every rank sends ``block`` bytes to every other rank (Open MPI's alltoallv).

    Open MPI 4.1's tuned component runs a pairwise exchange below 4 ranks (step k: send to
    rank + k, receive from rank - k) and posts every message at once from 4 to 63 ranks;
    both send ``p - 1`` messages per rank and put the same bytes on every host's link. The
    model is the pairwise schedule: at step ``k = q s + t`` (``s`` slots per host) the
    ``s - t`` ranks of a host whose partner is ``q`` hosts on and the ``t`` ranks whose
    partner is ``q + 1`` hosts on cross the network unless that partner host is their own,
    and those that cross share the link; a step without crossing is a step inside the host.
    """
    p, s, h = topo.workers, topo.slots_per_host, topo.hosts
    steps: dict[int, int] = {}  # ranks of a host crossing at a step -> number of such steps
    for k in range(1, p):
        q, t = divmod(k, s)
        crossing = (s - t) * (q % h != 0) + t * ((q + 1) % h != 0)
        steps[crossing] = steps.get(crossing, 0) + 1
    cost = ZERO_COST
    for crossing, count in sorted(steps.items()):
        step = link_step(block, topo, crosses=crossing > 0, sharing=max(crossing, 1))
        cost = cost + step.times(count)
    return cost


def _largest_block(n: float, p: int, itemsize: int) -> float:
    """Bytes of the largest of the ``p`` blocks ``ordered`` splits ``n`` bytes into: whole
    elements, the first ``elements % p`` blocks one element longer (``equal_counts``)."""
    return math.ceil(math.ceil(n / itemsize) / p) * itemsize


def _check_itemsize(itemsize: int) -> int:
    if isinstance(itemsize, bool) or not isinstance(itemsize, int) or itemsize < 1:
        raise ValueError(f"itemsize must be an int >= 1 (bytes per element), got {itemsize!r}")
    return itemsize


def _rank_order_reduce_scatter(n: float, topo: Topology, itemsize: int,
                               scatter: Callable[[float, Topology], Cost]) -> Cost:
    """Each rank gets every rank's copy of its block by ``scatter`` and sums them in rank
    order; the slowest rank has a largest block."""
    p = topo.workers
    if p == 1 or n == 0:  # nothing to send: the transport returns at once
        return ZERO_COST
    block = _largest_block(n, p, itemsize)
    return scatter(block, topo) + Cost(gamma=(p - 1) * block)


def _rank_order_allreduce(n: float, topo: Topology, itemsize: int,
                          scatter: Callable[[float, Topology], Cost],
                          gather: Callable[[float, Topology], Cost]) -> Cost:
    """Small buffers: ``gather`` them whole and sum locally; larger ones: the reduce-scatter
    above, then ``gather`` of the reduced blocks."""
    p = topo.workers
    if p == 1 or n == 0:
        return ZERO_COST
    if n * p <= ORDERED_SMALL_GATHER_BYTES:
        return gather(n, topo) + Cost(gamma=(p - 1) * n)
    block = _largest_block(n, p, itemsize)
    return _rank_order_reduce_scatter(n, topo, itemsize, scatter) + gather(block, topo)


def _mesh_exchange(block: float, topo: Topology) -> Cost:
    """Every rank sends ``block`` bytes to each of the other ``p - 1`` ranks at once, each
    over its own TCP connection (dlcomm's mesh, ``dlcomm.comm.tcp_mesh``): one latency.
    Across hosts the ``s`` ranks of a host put ``s (p - s)`` blocks on its link at once
    (their ``s - 1`` blocks inside the host go through memory meanwhile and are not
    charged); on one host each rank's ``p - 1`` blocks go through memory."""
    p, s = topo.workers, topo.slots_per_host
    if topo.hosts > 1:
        crossing = s * (p - s)
        return Cost(alpha=1.0, beta=block * crossing * topo.oversubscription,
                    link_bytes=block * crossing)
    return Cost(alpha_local=1.0, beta_local=block * (p - 1))


def _ordered_reduce_scatter(n: float, topo: Topology, itemsize: int) -> Cost:
    return _rank_order_reduce_scatter(n, topo, itemsize, _alltoall)


def _ordered_allreduce(n: float, topo: Topology, itemsize: int) -> Cost:
    return _rank_order_allreduce(n, topo, itemsize, _alltoall, _ring_allgather)


def _ordered_tcp_reduce_scatter(n: float, topo: Topology, itemsize: int) -> Cost:
    return _rank_order_reduce_scatter(n, topo, itemsize, _mesh_exchange)


def _ordered_tcp_allreduce(n: float, topo: Topology, itemsize: int) -> Cost:
    # The library pipelines the two halves segment by segment, but both send on the same
    # links, so their bytes add up; the latency is counted once per half.
    return _rank_order_allreduce(n, topo, itemsize, _mesh_exchange, _mesh_exchange)


def _ring_allgather(per_rank: float, topo: Topology) -> Cost:
    if topo.workers == 1:
        return ZERO_COST
    return _ring_step(per_rank, topo).times(topo.workers - 1)


def _with_call(cost: Cost, topo: Topology) -> Cost:
    """Add the per-call overhead to a collective over more than one rank."""
    return cost + Cost(overhead=1.0) if topo.workers > 1 else ZERO_COST


# --- building blocks without the per-call overhead ---------------------------------------

def _ring_allreduce(n: float, topo: Topology) -> Cost:
    p = topo.workers
    if p == 1:
        return ZERO_COST
    return _ring_step(n / p, topo).times(2 * (p - 1)) + Cost(gamma=(p - 1) / p * n)


def _rhd_allreduce(n: float, topo: Topology) -> Cost:
    p = topo.workers
    if p == 1:
        return ZERO_COST
    p2 = 1 << (p.bit_length() - 1)  # largest power of two <= p
    cost = ZERO_COST
    if p != p2:  # fold: the extra ranks hand over their whole buffer and get it back
        cost = cost + _exchange_step(n, topo, 1).times(2) + Cost(gamma=n)
    distance, size = p2 // 2, n / 2
    while distance >= 1:  # halving (reduce-scatter) and doubling (all-gather) mirror
        cost = cost + _exchange_step(size, topo, distance).times(2)
        distance, size = distance // 2, size / 2
    return cost + Cost(gamma=(p2 - 1) / p2 * n)


def _binomial(n: float, topo: Topology, *, reduce: bool) -> Cost:
    cost = ZERO_COST
    for k in range(_log2_ceil(topo.workers)):
        cost = cost + _tree_step(n, topo, 1 << k)
        if reduce:
            cost = cost + Cost(gamma=n)
    return cost


def _tree_allreduce(n: float, topo: Topology) -> Cost:
    return _binomial(n, topo, reduce=True) + _binomial(n, topo, reduce=False)


_FLAT = {"ring": _ring_allreduce, "rhd": _rhd_allreduce, "tree": _tree_allreduce}


def _hierarchical_allreduce(n: float, topo: Topology, leader_algorithm: str) -> Cost:
    if leader_algorithm not in FLAT_ALGORITHMS:
        raise ValueError(f"leader_algorithm must be one of {FLAT_ALGORITHMS}, got "
                         f"{leader_algorithm!r}")
    local = Topology(1, topo.slots_per_host)
    leaders = Topology(topo.hosts, 1, topo.oversubscription)
    return (_binomial(n, local, reduce=True) + _FLAT[leader_algorithm](n, leaders)
            + _binomial(n, local, reduce=False))


# --- public formulas ---------------------------------------------------------------------

def ring_allreduce(n: float, topo: Topology) -> Cost:
    """Ring reduce-scatter then all-gather: ``2(p-1)`` steps of ``n/p`` bytes."""
    return _with_call(_ring_allreduce(_check_bytes(n), topo), topo)


def rhd_allreduce(n: float, topo: Topology) -> Cost:
    """Recursive halving-doubling; a non-power-of-two ``p`` first folds ``p - p'`` ranks."""
    return _with_call(_rhd_allreduce(_check_bytes(n), topo), topo)


def tree_allreduce(n: float, topo: Topology) -> Cost:
    """Binomial reduce to rank 0, binomial broadcast back: ``2 ceil(log2 p)`` full rounds."""
    return _with_call(_tree_allreduce(_check_bytes(n), topo), topo)


def hierarchical_allreduce(n: float, topo: Topology, leader_algorithm: str = "ring") -> Cost:
    """Binomial reduce inside each host, ``leader_algorithm`` among the host leaders,
    binomial broadcast inside each host."""
    return _with_call(_hierarchical_allreduce(_check_bytes(n), topo, leader_algorithm), topo)


def ordered_allreduce(n: float, topo: Topology, itemsize: int = DEFAULT_ITEMSIZE) -> Cost:
    """dlcomm's ``ordered`` all-reduce of ``n`` bytes (elements of ``itemsize`` bytes).

    When the ``p`` copies fit in ``ORDERED_SMALL_GATHER_BYTES``: one all-gather of the
    whole buffers and ``p - 1`` sums of ``n`` bytes. Otherwise the ordered reduce-scatter
    (an all-to-all of blocks of ``n/p``, rounded up to whole elements, and ``p - 1`` sums
    of a block) and an all-gather of the reduced blocks. MPI's all-gather is modelled as a
    ring (the same bytes as every algorithm Open MPI picks for it), as calibration models
    ``dlcomm bench allgather``.
    """
    return _with_call(_ordered_allreduce(_check_bytes(n), topo, _check_itemsize(itemsize)),
                      topo)


def ordered_reduce_scatter(n: float, topo: Topology, itemsize: int = DEFAULT_ITEMSIZE) -> Cost:
    """dlcomm's ``ordered`` reduce-scatter of ``n`` bytes (the engine's reduce-scatter, and
    DeAR's first half, when ``DLCOMM_ALLREDUCE_ALGORITHM=ordered``): every rank sends each
    other rank its copy of that rank's block (``p - 1`` messages of the largest block) and
    reduces the ``p - 1`` copies it receives in rank order."""
    return _with_call(_ordered_reduce_scatter(_check_bytes(n), topo, _check_itemsize(itemsize)),
                      topo)


def ordered_tcp_allreduce(n: float, topo: Topology, itemsize: int = DEFAULT_ITEMSIZE) -> Cost:
    """dlcomm's ``ordered_tcp`` all-reduce: ``ordered``'s messages over the TCP mesh, where
    every rank sends to all its peers at once (``_mesh_exchange``): small buffers whole to
    every peer, larger ones as a scatter of blocks (reduced in rank order) and a gather of
    the reduced blocks."""
    return _with_call(
        _ordered_tcp_allreduce(_check_bytes(n), topo, _check_itemsize(itemsize)), topo)


def ordered_tcp_reduce_scatter(n: float, topo: Topology,
                               itemsize: int = DEFAULT_ITEMSIZE) -> Cost:
    """``ordered_tcp``'s reduce-scatter (the engine's when the all-reduce of that size is
    ``ordered_tcp``): the scatter of blocks over the mesh and ``p - 1`` sums of a block."""
    return _with_call(
        _ordered_tcp_reduce_scatter(_check_bytes(n), topo, _check_itemsize(itemsize)), topo)


def allreduce(algorithm: str, n: float, topo: Topology, leader_algorithm: str = "ring") -> Cost:
    """The all-reduce ``algorithm`` (one of ``ALLREDUCE_ALGORITHMS``) of ``n`` bytes."""
    if algorithm == "hierarchical":
        return hierarchical_allreduce(n, topo, leader_algorithm)
    if algorithm == "ordered":
        return ordered_allreduce(n, topo)
    if algorithm == "ordered_tcp":
        return ordered_tcp_allreduce(n, topo)
    if algorithm not in _FLAT:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; the simulator models "
                         f"{', '.join(ALLREDUCE_ALGORITHMS)} (MPI's own, 'mpi' or 'native', "
                         "changes algorithm with size and rank count: measure with one of "
                         "these)")
    return _with_call(_FLAT[algorithm](_check_bytes(n), topo), topo)


def ring_reduce_scatter(n: float, topo: Topology) -> Cost:
    """Ring reduce-scatter of ``n`` bytes: ``p-1`` steps of ``n/p`` (DeAR's first half)."""
    n, p = _check_bytes(n), topo.workers
    if p == 1:
        return ZERO_COST
    cost = _ring_step(n / p, topo).times(p - 1) + Cost(gamma=(p - 1) / p * n)
    return _with_call(cost, topo)


def ring_allgather(per_rank: float, topo: Topology) -> Cost:
    """Ring all-gather of ``per_rank`` bytes from every rank: ``p-1`` steps."""
    return _with_call(_ring_allgather(_check_bytes(per_rank), topo), topo)


def bruck_allgather(per_rank: float, topo: Topology) -> Cost:
    """Bruck's all-gather: ``ceil(log2 p)`` steps; at step k every rank sends
    ``min(2^k, p - 2^k)`` blocks to the rank ``2^k`` below it (MPI's choice for small
    payloads; the same ``(p-1)`` blocks in all as the ring, with ``log p`` latencies)."""
    per_rank, p = _check_bytes(per_rank), topo.workers
    if p == 1:
        return ZERO_COST
    cost = ZERO_COST
    for k in range(_log2_ceil(p)):
        blocks = min(1 << k, p - (1 << k))
        cost = cost + _exchange_step(per_rank * blocks, topo, 1 << k)
    return _with_call(cost, topo)


def size_exchange(topo: Topology) -> Cost:
    """The all-gather of 8-byte sizes before an all-gather of unequal payloads
    (recursive doubling: latency only)."""
    cost = ZERO_COST
    for k in range(_log2_ceil(topo.workers)):
        cost = cost + _exchange_step(0.0, topo, 1 << k)
    return cost


def peer_allgather(per_rank: float, topo: Topology) -> Cost:
    """Ring all-gather of ``per_rank`` bytes among peers, the ranks with one local rank on
    every host (htopk's PEER round): ``hosts - 1`` steps that all cross the network, with
    the ``slots_per_host`` peer groups running at once and so sharing each host's link."""
    per_rank = _check_bytes(per_rank)
    if topo.hosts == 1:
        return ZERO_COST
    step = link_step(per_rank, topo, crosses=True, sharing=topo.slots_per_host)
    return step.times(topo.hosts - 1) + Cost(overhead=1.0)


def gtopk_merge_tree(pair_bytes: float, topo: Topology) -> Cost:
    """gTop-k's merge: ``log2 p'`` rounds of recursive doubling in which every rank swaps
    its ``pair_bytes`` (k values and k indices) with a partner; with ``p = p' + e`` the
    ``e`` extra ranks hand theirs over first and get the result back (2 more rounds)."""
    pair_bytes, p = _check_bytes(pair_bytes), topo.workers
    if p == 1:
        return ZERO_COST
    p2 = 1 << (p.bit_length() - 1)
    cost = ZERO_COST
    if p != p2:
        cost = cost + _exchange_step(pair_bytes, topo, p2).times(2)
    distance = 1
    while distance < p2:
        cost = cost + _exchange_step(pair_bytes, topo, distance)
        distance *= 2
    return _with_call(cost, topo)


def binomial_broadcast(n: float, topo: Topology) -> Cost:
    """Binomial broadcast of ``n`` bytes from rank 0: ``ceil(log2 p)`` rounds."""
    return _with_call(_binomial(_check_bytes(n), topo, reduce=False), topo)
