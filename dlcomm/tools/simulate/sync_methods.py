"""The synchronisation methods beside BSP: DS-Sync's groups, LB-BSP under a straggler trace,
DLCP's bounded-loss exchange under congestion. Each follows dlcomm's implementation
(docs/heterogeneity.md) and reuses its pure parts (LB-BSP's balancer).

* DS-Sync: after its own optimizer step, a worker averages parameters with its group
  (``group_size`` workers, a fresh random partition each step) in one blocking MPI
  all-reduce (modelled as MPI's faster of ring and halving-doubling);
  no overlap with backward. Groups are disjoint, so all of them run at once; members sit on
  different hosts, and every rank of a host averages with its own group at the same moment,
  so the host's link is shared by its slots.
* LB-BSP: each iteration waits for the slowest worker (forward and backward scale with the
  local batch over the worker's speed); every interval (2, 4, ... then ``interval``
  iterations) the balancer (``dlcomm.heterogeneity.lbbsp.BatchBalancer``) re-sizes the batches from
  the speeds measured over the interval. BSP is the same loop without re-sizing.
* DLCP: after backward, a shard exchange (every rank sends each owner its shard: the
  mandatory chunks, then the droppable ones, at most ``loss_tolerance`` of the elements of
  unprotected tensors: 2-D and at least 1024 elements) with a deadline of ``slack`` x the
  median of recent complete exchanges; what missed it is still sent and drained at the
  start of the next exchange (so it overlaps the next forward and backward); then a
  lossless all-gather of the averaged shards. Each host's link runs at the congestion
  trace's rate at the exchange (held for the exchange).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import numpy as np

from dlcomm.tools.simulate.engine import IterationResult, simulate_bsp
from dlcomm.tools.simulate.messages import MessageModel
from dlcomm.tools.simulate.methods import Method, SyncSpec
from dlcomm.tools.simulate.network import Network, Topology
from dlcomm.tools.simulate.traces import CongestionTrace, StragglerTrace
from dlcomm.tools.simulate.workload import Workload

MessageFactory = Callable[[Method, Network], MessageModel]
DLCP_MIN_SIZE = 1024  # DLCOMM_DLCP_MIN_SIZE's default: smaller (and 1-D) tensors are protected


def simulate_dssync(workload: Workload, method: Method, network: Network,
                    make_messages: MessageFactory, *, global_every: int = 0) -> IterationResult:
    """DS-Sync with ``method.sync.group_size``; ``global_every`` > 0 adds one global average
    (through the engine, all ranks) every that many iterations (the demo's per-epoch one)."""
    size = method.sync.group_size
    topo = network.topology
    bsp = dataclasses.replace(method, sync=SyncSpec())
    if size >= topo.workers:  # dlcomm's optimizer is then plain BSP
        return simulate_bsp(workload, bsp, make_messages(bsp, network))
    if topo.hosts == 1:
        group = Topology(1, size)
    else:
        group = Topology(size, 1, topo.oversubscription * topo.slots_per_host)
    # dlcomm averages a group with MPI's own blocking all-reduce on the group's communicator
    mpi = dataclasses.replace(bsp, algorithm="mpi")
    average = make_messages(mpi, network.with_topology(group)).dense_allreduce(
        float(workload.parameter_bytes))
    # every rank of a host sends its own group's average through the host's link
    seconds, payload = average.seconds, average.payload_bytes
    link = average.link_bytes * (topo.slots_per_host if topo.hosts > 1 else 1)
    if global_every > 0:
        everyone = make_messages(bsp, network).dense_allreduce(float(workload.parameter_bytes))
        seconds += everyone.seconds / global_every
        link += everyone.link_bytes / global_every
        payload += everyone.payload_bytes / global_every
    iteration = workload.compute_s + seconds
    return IterationResult(iteration, workload.compute_s, seconds, link, payload, (iteration,))


@dataclasses.dataclass(frozen=True)
class BalancedRun:
    """LB-BSP's (or BSP's) run over a trace: the figures and the final batch sizes."""

    result: IterationResult
    batch_sizes: tuple[int, ...]


def ramp_intervals(interval: int) -> Iterator[int]:
    """LB-BSP's re-size points: after 2, 4, 8, ... iterations up to ``interval``, then every
    ``interval`` (``BatchBalancer``'s ramp)."""
    span = min(2, interval)
    while True:
        yield span
        span = min(2 * span, interval)


def simulate_balanced(workload: Workload, method: Method, network: Network,
                      make_messages: MessageFactory, trace: StragglerTrace, iterations: int
                      ) -> BalancedRun:
    """``iterations`` iterations under ``trace``; re-sizes batches when ``method.sync`` is
    LB-BSP, keeps them equal otherwise (BSP)."""
    from dlcomm.heterogeneity.lbbsp import BatchBalancer

    workers = network.workers
    if trace.workers != workers:
        raise ValueError(f"the straggler trace has {trace.workers} workers, the network "
                         f"{workers}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    spec = method.sync
    balanced = spec.kind == "lbbsp"
    bsp = dataclasses.replace(method, sync=SyncSpec())
    messages = make_messages(bsp, network)
    base = workload.batch_size
    balancer = BatchBalancer(base * workers, workers, 0, min_batch=spec.min_batch,
                             max_batch=max(int(spec.max_batch_factor * base), base),
                             predictor=spec.predictor, interval=spec.interval)
    batches = np.array(balancer.batch_sizes, dtype=np.float64)
    cache: dict[float, IterationResult] = {}
    fb = workload.forward_s + workload.backward_s
    times, busy, link, payload = [], 0.0, 0.0, 0.0
    ramp = ramp_intervals(spec.interval)
    span, since = next(ramp), 0
    samples = np.zeros(workers)
    seconds = np.zeros(workers)
    for t in range(iterations):
        speeds = np.asarray(trace.at(t), dtype=np.float64)
        factors = batches / base / speeds
        slowest = round(float(factors.max()), 12)
        if slowest not in cache:
            cache[slowest] = simulate_bsp(workload.scaled(slowest), bsp, messages)
        r = cache[slowest]
        times.append(r.iteration_s)
        busy, link, payload = busy + r.comm_busy_s, link + r.link_bytes, payload + r.payload_bytes
        if not balanced:
            continue
        samples += batches
        seconds += np.maximum(factors * fb, 1e-12)
        since += 1
        if since == span:
            batches = np.array(balancer.update_from_speeds(samples / seconds), dtype=np.float64)
            samples[:] = 0.0
            seconds[:] = 0.0
            since, span = 0, next(ramp)
    n = len(times)
    result = IterationResult(sum(times) / n, workload.compute_s, busy / n, link / n,
                             payload / n, tuple(times))
    return BalancedRun(result, tuple(int(b) for b in batches))


@dataclasses.dataclass(frozen=True)
class LossyRun:
    """DLCP's run: the figures and the mean fraction of gradient elements lost per step."""

    result: IterationResult
    lost_fraction: float


def simulate_dlcp(workload: Workload, method: Method, network: Network,
                  make_messages: MessageFactory, congestion: CongestionTrace, iterations: int,
                  *, slack: float = 1.2, warmup: int = 3, window: int = 20) -> LossyRun:
    """DLCP's exchange at ``method.loss_tolerance`` for ``iterations`` iterations."""
    topo, params = network.topology, network.params
    if congestion.hosts != topo.hosts:
        raise ValueError(f"the congestion trace has {congestion.hosts} hosts, the network "
                         f"{topo.hosts}")
    workers, slots = topo.workers, topo.slots_per_host
    droppable = sum(t.nbytes for t in workload.tensors
                    if len(t.shape) >= 2 and t.numel >= DLCP_MIN_SIZE)
    drop_share = method.loss_tolerance * droppable / max(workload.parameter_bytes, 1)
    # Bytes over one host's link in each phase: its ranks' shares for the other hosts' ranks.
    phase_bytes = slots * (workers - slots) / workers * workload.parameter_bytes
    latency = params.overhead + (workers - 1) * (params.alpha if topo.hosts > 1
                                                 else params.alpha_local)
    local_only = topo.hosts == 1
    fb = workload.forward_s + workload.backward_s
    backlog = np.zeros(topo.hosts)
    history: list[float] = []
    clock, times, lost, busy = 0.0, [], [], 0.0
    for _ in range(iterations):
        start = clock + fb
        rate = np.asarray(congestion.rates(start), dtype=np.float64) / 8.0  # bytes/s
        if local_only:
            rate = np.full(topo.hosts, 1.0 / params.beta_local if params.beta_local else math.inf)
        backlog = np.maximum(backlog - fb * rate, 0.0)
        drain = float(np.max(backlog / rate))
        backlog[:] = 0.0
        full = phase_bytes / rate + latency
        mandatory = (1.0 - drop_share) * phase_bytes / rate + latency
        t_full, t_mand = float(full.max()), float(mandatory.max())
        if method.loss_tolerance > 0 and len(history) >= warmup:
            deadline = max(slack * float(np.median(history[-window:])), t_mand)
        else:
            deadline = math.inf
        phase1 = min(t_full, deadline)
        late = np.maximum(full - phase1, 0.0) * rate
        backlog += late
        if phase1 >= t_full:
            history.append(t_full)
        lost.append(float(late.sum()) / max(phase_bytes * topo.hosts, 1.0))
        phase2 = float((phase_bytes / rate).max()) + latency
        exchange = drain + phase1 + phase2
        busy += exchange
        iteration = fb + exchange + workload.update_s
        times.append(iteration)
        clock += iteration
    n = len(times)
    link = 2 * phase_bytes
    result = IterationResult(sum(times) / n, workload.compute_s, busy / n, link,
                             float(workload.parameter_bytes), tuple(times))
    return LossyRun(result, float(np.mean(lost)))


# Simulated rates an iteration under congestion is interpolated between (simulate_congested_bsp)
CONGESTION_GRID = 33


def simulate_congested_bsp(workload: Workload, method: Method, network: Network,
                           make_messages: MessageFactory, congestion: CongestionTrace,
                           iterations: int) -> IterationResult:
    """The lossless engine path under the same congestion. A ring (and the mesh's
    all-to-all) runs at its slowest edge's rate, and that rate may change while an iteration
    communicates: each iteration runs at the slowest rate averaged over its own
    communication window (from the end of forward to its end; the bytes drain at whatever
    rate holds at each moment), found by bisection on the iteration's length. An iteration
    at a rate between the trace's is interpolated in seconds per byte between
    ``CONGESTION_GRID`` simulated ones (its time is piecewise linear in them)."""
    rates = [congestion.base_rate] + [r for host in congestion.periods for _, _, r in host]
    fast, slow = 8.0 / max(rates), 8.0 / min(rates)  # seconds per byte
    grid: dict[int, IterationResult] = {}

    def point(i: int) -> IterationResult:
        if i not in grid:
            beta = fast + (slow - fast) * i / (CONGESTION_GRID - 1)
            net = network.with_params(beta=beta)
            grid[i] = simulate_bsp(workload, method, make_messages(method, net))
        return grid[i]

    def at(rate: float) -> tuple[float, float, float, float]:
        """(iteration, channel busy, link bytes, payload bytes) at ``rate`` bit/s."""
        x = 0.0 if slow == fast else (8.0 / rate - fast) / (slow - fast) * (CONGESTION_GRID - 1)
        i = min(max(int(x), 0), CONGESTION_GRID - 2)
        w = min(max(x - i, 0.0), 1.0)
        a, b = point(i), point(i + 1) if w > 0 else point(i)
        return tuple((1 - w) * u + w * v for u, v in (  # type: ignore[return-value]
            (a.iteration_s, b.iteration_s), (a.comm_busy_s, b.comm_busy_s),
            (a.link_bytes, b.link_bytes), (a.payload_bytes, b.payload_bytes)))

    clock, times, busy, link, payload = 0.0, [], 0.0, 0.0, 0.0
    start_offset = workload.forward_s
    for _ in range(iterations):
        start = clock + start_offset
        first = min(congestion.rates(start))
        r = at(first)
        if abs(congestion.mean_slowest_rate(start, clock + r[0]) - first) > 1e-9 * first:
            # the rate changes inside the window. The length at the mean rate over
            # [start, clock + T], less T: > 0 for T near 0 (the rate at the start alone),
            # <= 0 at the length at the trace's slowest rate
            low, high = 0.0, at(8.0 / slow)[0]
            for _ in range(40):
                mid = (low + high) / 2
                if at(congestion.mean_slowest_rate(start, clock + mid))[0] > mid:
                    low = mid
                else:
                    high = mid
            r = at(congestion.mean_slowest_rate(start, clock + high))
        times.append(r[0])
        busy, link, payload = busy + r[1], link + r[2], payload + r[3]
        clock += r[0]
    n = len(times)
    return IterationResult(sum(times) / n, workload.compute_s, busy / n, link / n, payload / n,
                           tuple(times))
