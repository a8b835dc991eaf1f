"""What one message of the engine costs: a fused group of gradients sent with a method's
compressor and all-reduce algorithm over a network.

Mirrors dlcomm's executor: dense gradients of a group travel in one fused all-reduce with
the method's algorithm; summable compressors (every round an all-reduce) fuse each round's
payloads of the whole group the same way, with bypassed tensors dense in the first round;
the others run through MPI's own collectives (``MPICommAdapter``), the group's tensors
together: per round one all-reduce of the world all-reduce payloads (the bypassed tensors
dense in the first), and per group of ranks one all-gather of the all-gather payloads and
one gTop-k merge tree carrying every tensor's payloads; reduce-scatters tensor by tensor.
``auto`` (the engine's default) is charged as the faster of ``ordered`` and ``ordered_tcp``
at each size, as its measured cost model chooses. MPI chooses its algorithm per size; the
model takes the faster of ring and halving-doubling for its all-reduce and of ring and
Bruck for its all-gather (the choice an MPI tuned for the network would make). The engine's
reduce-scatter (DeAR's first half) is the ``ordered`` one under ``ordered``, the mesh's
under ``ordered_tcp``, that of the all-reduce auto picks under ``auto``, and MPI's own (a
ring) under every other algorithm. Compression runs on the engine's thread, so its time
occupies the channel.

Rounds over a HOST or PEER group (``htopk``) run on sub-communicators: a HOST round is MPI's
collective on one host (``Topology(1, slots)``: local links only), a PEER round a ring
all-gather among the hosts in which every rank of a host crosses at once
(``collectives.peer_allgather``); only PEER rounds put bytes on the network link.
``topk:hierarchical=auto`` sends each tensor through flat top-k or ``htopk``, whichever this
model predicts faster for the tensor alone, where hosts hold several ranks (as the library
does with its measurement); the group's rounds then mix both.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from dlcomm.tools.simulate import collectives
from dlcomm.tools.simulate.compressors import (
    ALLGATHER,
    ALLREDUCE,
    HOST,
    PEER,
    REDUCE_SCATTER,
    SPARSE_MERGE,
    WORLD,
    CompressorModel,
    MeasuredCost,
)
from dlcomm.tools.simulate.devices import Device
from dlcomm.tools.simulate.methods import AUTO, AUTO_CANDIDATES, Method
from dlcomm.tools.simulate.network import Cost, Network, Topology
from dlcomm.tools.simulate.workload import Tensor


@dataclasses.dataclass(frozen=True)
class MessageCost:
    """Seconds on the communication channel, bytes through one host's network link, bytes
    handed to collectives (what ``dlcomm.bytes_sent()`` counts), the part of ``seconds``
    spent computing (compression), which also keeps the device from training when
    compression shares it, and the number of collective calls."""

    seconds: float
    link_bytes: float
    payload_bytes: float
    compute_s: float = 0.0
    calls: int = 0

    def __add__(self, other: MessageCost) -> MessageCost:
        return MessageCost(self.seconds + other.seconds, self.link_bytes + other.link_bytes,
                           self.payload_bytes + other.payload_bytes,
                           self.compute_s + other.compute_s, self.calls + other.calls)


NOTHING = MessageCost(0.0, 0.0, 0.0, 0.0)
MPI_ALLREDUCE = "mpi_allreduce"
# htopk's rounds over a group (MessageModel.collective's kinds), by (library kind, group).
HOST_REDUCE_SCATTER, HOST_ALLGATHER, PEER_ALLGATHER = (
    "host_reduce_scatter", "host_allgather", "peer_allgather")
GROUP_KINDS = {(REDUCE_SCATTER, HOST): HOST_REDUCE_SCATTER, (ALLGATHER, HOST): HOST_ALLGATHER,
               (ALLGATHER, PEER): PEER_ALLGATHER}
# The float32 sizes dlcomm's MG-WFBP times its all-reduce at to fit alpha and beta
# (dlcomm.torch.schedules.cost_model.DEFAULT_PROBE_BYTES; the simulator loads no torch).
MGWFBP_PROBE_BYTES = (4 << 10, 64 << 10, 512 << 10, 2 << 20)


def check_cpu_share(value: float) -> float:
    """``value`` as a float >= 1 (how many times longer a process's CPU work takes than
    alone); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 1:
        raise ValueError(f"cpu_share must be a number >= 1 (ranks per core where ranks "
                         f"outnumber cores; 1 where each has a core), got {value!r}")
    return float(value)


def check_busy_call(value: float) -> float:
    """``value`` as a float >= 0 (seconds); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"busy_call_s must be a number of seconds >= 0 (what a collective "
                         f"call costs more while the ranks sharing the cores compute), got "
                         f"{value!r}")
    return float(value)


class MessageModel:
    """Costs of messages under ``method`` on ``network``, with compression on ``device``
    (sharing it with training when ``compression_on_device``). ``cpu_share`` >= 1 stretches
    the compression's cost, measured or estimated for one process alone, where ranks
    outnumber a machine's cores (``predict``'s argument). ``busy_call_s`` is what each
    collective call, and each negotiation the engine runs for a group, of an operation that
    compresses costs more where ranks sharing the cores compute meanwhile (``dlcomm bench
    roundtrip``'s busy minus idle round trip): a rank's waits progress only when the
    scheduler runs it."""

    def __init__(self, method: Method, network: Network, device: Device,
                 measured_costs: Mapping[str, MeasuredCost] | None = None,
                 compression_on_device: bool = True, cpu_share: float = 1.0,
                 busy_call_s: float = 0.0) -> None:
        self.method = method
        self.cpu_share = check_cpu_share(cpu_share)
        self.busy_call_s = check_busy_call(busy_call_s)
        self.compression_on_device = bool(compression_on_device)
        self.network = network
        self.device = device
        self.measured_costs = dict(measured_costs or {})
        self.compressor = method.compressor
        self._collective = lru_cache(maxsize=None)(self._collective_uncached)
        self._choices: dict[tuple[int, int], CompressorModel] = {}  # model_for's, by size

    def _from_cost(self, cost: Cost, payload: float) -> MessageCost:
        return MessageCost(cost.seconds(self.network.params), cost.link_bytes, payload,
                           calls=1)

    def _negotiated(self, cost: MessageCost, compresses: bool) -> MessageCost:
        """``cost`` of one engine operation: where it ``compresses``, its calls and its
        negotiation, each ``busy_call_s`` longer on a crowded machine. Its ranks compress
        on the shared cores at once, so its calls are made while the cores are saturated
        and a waiting rank runs only when the scheduler gets to it; a dense operation's
        ranks wait on the wire with the cores idle and run as soon as they are woken (the
        dense runs fit without a wait: docs/simulation.md)."""
        if not (self.busy_call_s and cost.calls and compresses):
            return cost
        return cost + MessageCost(self.busy_call_s * (cost.calls + 1), 0.0, 0.0)

    def _fastest(self, *costs: Cost) -> Cost:
        return min(costs, key=lambda c: c.seconds(self.network.params))

    def _collective_uncached(self, kind: str, nbytes: float) -> MessageCost:
        topo, m = self.network.topology, self.method
        if kind == ALLREDUCE and m.algorithm == AUTO:
            cost = self._fastest(*(collectives.allreduce(a, nbytes, topo)
                                   for a in AUTO_CANDIDATES))
        elif kind == ALLREDUCE and m.algorithm != "mpi":
            cost = collectives.allreduce(m.algorithm, nbytes, topo, m.leader_algorithm)
        elif kind in (ALLREDUCE, MPI_ALLREDUCE):
            cost = self._fastest(collectives.ring_allreduce(nbytes, topo),
                                 collectives.rhd_allreduce(nbytes, topo))
        elif kind == ALLGATHER:
            cost = self._fastest(collectives.ring_allgather(nbytes, topo),
                                 collectives.bruck_allgather(nbytes, topo))
            cost = cost + collectives.size_exchange(topo)
        elif kind == SPARSE_MERGE:
            cost = collectives.gtopk_merge_tree(nbytes, topo)
        elif kind == "reducescatter" and m.algorithm in ("ordered", "ordered_tcp", AUTO):
            algorithm = m.algorithm
            if algorithm == AUTO:  # the reduce-scatter of the all-reduce auto picks here
                algorithm = min(AUTO_CANDIDATES, key=lambda a: collectives.allreduce(
                    a, nbytes, topo).seconds(self.network.params))
            cost = (collectives.ordered_tcp_reduce_scatter(nbytes, topo)
                    if algorithm == "ordered_tcp"
                    else collectives.ordered_reduce_scatter(nbytes, topo))
        elif kind == "reducescatter":
            cost = collectives.ring_reduce_scatter(nbytes, topo)
        elif kind == "ringallgather":
            cost = collectives.ring_allgather(nbytes, topo)
        elif kind == HOST_REDUCE_SCATTER:  # MPI's reduce-scatter on one host
            cost = collectives.ring_reduce_scatter(nbytes, Topology(1, topo.slots_per_host))
        elif kind == HOST_ALLGATHER:
            host = Topology(1, topo.slots_per_host)
            cost = self._fastest(collectives.ring_allgather(nbytes, host),
                                 collectives.bruck_allgather(nbytes, host))
            cost = cost + collectives.size_exchange(host)
        elif kind == PEER_ALLGATHER:  # sizes among the hosts first (latency only)
            peers = Topology(topo.hosts, 1, topo.oversubscription)
            cost = collectives.peer_allgather(nbytes, topo) + collectives.size_exchange(peers)
        else:
            raise ValueError(f"unknown collective kind {kind!r}")
        return self._from_cost(cost, nbytes)

    def collective(self, kind: str, nbytes: float) -> MessageCost:
        """One collective: ``allreduce`` (the method's algorithm), ``mpi_allreduce`` (MPI's),
        ``allgather`` (payloads of ``nbytes`` per rank, through MPI), ``sparse_merge``
        (gTop-k's tree), ``reducescatter`` or ``ringallgather`` (DeAR's halves),
        ``host_reduce_scatter``, ``host_allgather`` or ``peer_allgather`` (htopk's rounds
        over a host or among the hosts, ``GROUP_KINDS``)."""
        return self._collective(kind, float(nbytes))

    def dense_allreduce(self, nbytes: float) -> MessageCost:
        """A plain fused all-reduce of ``nbytes`` with the method's algorithm."""
        return self.collective(ALLREDUCE, nbytes)

    def _compute(self, tensor: Tensor, model: CompressorModel) -> float:
        return self.cpu_share * model.compute_seconds(
            tensor, self.network.workers, self.device, self.measured_costs, self._shards)

    def model_for(self, tensor: Tensor, step: int = 0) -> CompressorModel:
        """The compressor ``tensor`` goes through: the method's, or for
        ``topk:hierarchical=auto`` flat or hierarchical top-k, whichever this model predicts
        faster for the tensor alone (flat where no host holds several ranks)."""
        c = self.compressor
        topo = self.network.topology
        if c.alternative is None or topo.hosts < 2 or topo.slots_per_host < 2:
            return c
        key = (tensor.numel, step)
        if key not in self._choices:
            self._choices[key] = min(
                (c, c.alternative),
                key=lambda m: self._negotiated(self._group([tensor], step, m),
                                               compresses=True).seconds)
        return self._choices[key]

    @property
    def _shards(self) -> int:
        """htopk's shards: the ranks of a host (every host has as many here)."""
        return self.network.topology.slots_per_host

    def _round_kind(self, kind: str, group: str) -> str:
        """This model's collective for a compressor round of ``kind`` over ``group``."""
        if group == WORLD:
            return MPI_ALLREDUCE if kind == ALLREDUCE else kind
        if (kind, group) not in GROUP_KINDS:
            raise ValueError(f"{self.compressor.name}: the simulator has no model of a "
                             f"{kind} round over the {group} group")
        return GROUP_KINDS[kind, group]

    def _applies(self, tensor: Tensor) -> bool:
        m = self.method
        return self.compressor.applies_to(tensor, m.min_compress_size, m.compress_1d)

    def group(self, tensors: Sequence[Tensor], step: int = 0) -> MessageCost:
        """The engine's handling of one fused group of ready gradients at iteration
        ``step`` (ACP-SGD alternates P and Q with the step)."""
        compresses = not self.compressor.is_dense and any(self._applies(t) for t in tensors)
        return self._negotiated(self._group(tensors, step), compresses=compresses)

    def _group(self, tensors: Sequence[Tensor], step: int,
               model: CompressorModel | None = None) -> MessageCost:
        """``model`` (optional): every compressed tensor through it, else through
        ``model_for``'s choice."""
        if not tensors:
            return NOTHING
        c = self.compressor
        if c.is_dense:
            return self.dense_allreduce(sum(t.nbytes for t in tensors))
        # One run_rounds for the group's tensors, as the engine: per round one all-reduce of
        # every world all-reduce payload (in the first, with the bypassed tensors): with the
        # method's algorithm for a summable compressor, on MPI's own otherwise; per group of
        # ranks one all-gather of every all-gather payload and one merge tree carrying every
        # tensor's payloads; reduce-scatters tensor by tensor.
        world_sum = ALLREDUCE if c.summable else MPI_ALLREDUCE
        compressed = [t for t in tensors if self._applies(t)]
        models = [model or self.model_for(t, step) for t in compressed]
        compute = sum(self._compute(t, m) for t, m in zip(compressed, models))
        total = MessageCost(compute, 0.0, 0.0, compute)
        rounds = [[(kind, nbytes, group) for (kind, nbytes), group in
                   zip(m.round_payloads(t, step, self._shards), m.round_groups)]
                  for t, m in zip(compressed, models)]
        batched = {world_sum: sum(t.nbytes for t in tensors if not self._applies(t))}
        for r in range(max((len(per_tensor) for per_tensor in rounds), default=1)):
            for per_tensor in rounds:
                if r >= len(per_tensor):
                    continue
                kind, nbytes, group = per_tensor[r]
                if (kind, group) == (ALLREDUCE, WORLD):
                    key = world_sum
                elif kind in (ALLGATHER, SPARSE_MERGE):
                    key = self._round_kind(kind, group)
                else:
                    total = total + self.collective(self._round_kind(kind, group), nbytes)
                    continue
                batched[key] = batched.get(key, 0.0) + nbytes
            for kind, nbytes in batched.items():
                if nbytes > 0:
                    total = total + self.collective(kind, nbytes)
            batched = {}
        return total

    def reduce_scatter(self, nbytes: float) -> MessageCost:
        """DeAR's first half: the engine's reduce-scatter of a bucket of ``nbytes`` (the
        ordered one under ``ordered``, over the mesh under ``ordered_tcp``, the one of the
        all-reduce ``auto`` picks at that size under ``auto``, else MPI's, a ring). Dense:
        no busy wait (``_negotiated``)."""
        return self.collective("reducescatter", nbytes)

    def all_gather(self, nbytes: float) -> MessageCost:
        """DeAR's second half: the ring all-gather of a bucket of ``nbytes`` in all. Dense:
        no busy wait (``_negotiated``)."""
        return self.collective("ringallgather", nbytes / self.network.workers)

    def alpha_beta(self) -> tuple[float, float]:
        """``time = a + b * bytes`` of the dense all-reduce as MG-WFBP fits it at start-up:
        least squares through the all-reduce's times at ``MGWFBP_PROBE_BYTES``, both clipped
        at 0 (``dlcomm.torch.schedules.cost_model.fit_alpha_beta``). Exact for algorithms
        whose time is linear in the bytes; ``ordered`` switches from gathering whole buffers
        to its all-to-all inside the probes' range, and MG-WFBP sees that bend as this line."""
        x = np.array(MGWFBP_PROBE_BYTES, dtype=np.float64)
        y = np.array([self.dense_allreduce(float(b)).seconds for b in MGWFBP_PROBE_BYTES])
        design = np.stack([np.ones_like(x), x], axis=1)
        (alpha, beta), *_ = np.linalg.lstsq(design, y, rcond=None)
        beta = max(float(beta), 0.0)
        if alpha < 0:  # through the origin, as the library refits
            alpha, beta = 0.0, max(float(x @ y / (x @ x)), 0.0)
        return float(alpha), beta
