"""One prediction: time per iteration, communication volume and scaling efficiency of a
workload under a method on a network (the entry point behind ``dlcomm simulate predict``).

Scaling efficiency is weak scaling, as the seeds report it: the same batch per worker, so
``compute_s / iteration_s`` (1 = communication fully hidden) and throughput
``workers x batch / iteration_s``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from dlcomm.tools.simulate.compressors import MeasuredCost
from dlcomm.tools.simulate.devices import Device
from dlcomm.tools.simulate.engine import IterationResult, simulate_bsp
from dlcomm.tools.simulate.messages import MessageModel, check_busy_call, check_cpu_share
from dlcomm.tools.simulate.methods import Method
from dlcomm.tools.simulate.network import Network
from dlcomm.tools.simulate.sync_methods import (
    simulate_balanced,
    simulate_congested_bsp,
    simulate_dlcp,
    simulate_dssync,
)
from dlcomm.tools.simulate.traces import CongestionTrace, StragglerTrace
from dlcomm.tools.simulate.workload import Workload

DEFAULT_TRACE_ITERATIONS = 200


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What the simulator predicts for one (workload, method, network)."""

    method: str
    workload: str
    workers: int
    hosts: int
    slots_per_host: int
    batch_size: int
    iteration_s: float
    compute_s: float
    comm_busy_s: float
    link_bytes: float
    payload_bytes: float
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        """Samples per second over all workers."""
        return self.workers * self.batch_size / self.iteration_s

    @property
    def scaling_efficiency(self) -> float:
        """Compute-only iteration time over the predicted one (weak scaling)."""
        return self.compute_s / self.iteration_s

    @property
    def exposed_comm_s(self) -> float:
        """Iteration time not covered by computation."""
        return max(self.iteration_s - self.compute_s, 0.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures, derived ones included."""
        out = dataclasses.asdict(self)
        out["details"] = dict(self.details)
        out.update(samples_per_s=self.samples_per_s,
                   scaling_efficiency=self.scaling_efficiency,
                   exposed_comm_s=self.exposed_comm_s)
        return out


def message_factory(device: Device, measured_costs: Mapping[str, MeasuredCost] | None = None,
                    compression_on_device: bool = True, cpu_share: float = 1.0,
                    busy_call_s: float = 0.0):  # noqa: ANN201 - a closure
    """A ``(method, network) -> MessageModel`` with compression on ``device``."""

    def make(method: Method, network: Network) -> MessageModel:
        return MessageModel(method, network, device, measured_costs, compression_on_device,
                            cpu_share, busy_call_s)

    return make


def predict(workload: Workload, method: Method, network: Network, device: Device, *,
            measured_costs: Mapping[str, MeasuredCost] | None = None,
            stragglers: StragglerTrace | None = None,
            congestion: CongestionTrace | None = None,
            iterations: int = DEFAULT_TRACE_ITERATIONS, global_every: int = 0,
            compression_on_device: bool = True, cpu_share: float = 1.0,
            busy_call_s: float = 0.0) -> Prediction:
    """Simulate ``method``. ``stragglers`` (per-iteration worker speeds) drive LB-BSP and a
    BSP run with stragglers; ``congestion`` (per-host link rates over time) drives DLCP and
    a lossless run under congestion; both run ``iterations`` iterations. ``global_every``:
    DS-Sync's global average every that many iterations (0: never).
    ``compression_on_device``: compression keeps the device from training (see
    ``engine.simulate_bsp``). ``cpu_share`` >= 1: compression takes that many times its
    one-process cost, as where ranks outnumber a machine's cores (ranks per core); the
    workload's times are taken as given (``Workload.scaled`` stretches them).
    ``busy_call_s``: what each collective call and negotiation of an operation that
    compresses costs more while ranks sharing the cores compute (``MessageModel``)."""
    if not isinstance(method, Method):
        raise TypeError(f"method must be a Method, got {type(method).__name__}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    check_cpu_share(cpu_share)
    check_busy_call(busy_call_s)
    make = message_factory(device, measured_costs, compression_on_device, cpu_share,
                           busy_call_s)
    topo = network.topology
    details: dict[str, Any] = {}
    if method.loss_tolerance > 0 or (congestion is not None and method.sync.kind == "bsp"):
        trace = congestion or CongestionTrace.steady(topo.hosts, _link_rate(network))
        if method.loss_tolerance > 0:
            run = simulate_dlcp(workload, method, network, make, trace, iterations)
            result: IterationResult = run.result
            details["lost_fraction"] = run.lost_fraction
        else:
            result = simulate_congested_bsp(workload, method, network, make, trace, iterations)
    elif method.sync.kind == "dssync":
        result = simulate_dssync(workload, method, network, make, global_every=global_every)
        if stragglers is not None:
            details["stragglers"] = "not modelled for DS-Sync: ignored"
    elif method.sync.kind == "lbbsp" or stragglers is not None:
        trace = stragglers or StragglerTrace.uniform(topo.workers)
        run = simulate_balanced(workload, method, network, make, trace, iterations)
        result = run.result
        details["batch_sizes"] = list(run.batch_sizes)
        if congestion is not None:
            details["congestion"] = "not modelled with LB-BSP: ignored"
    else:
        result = simulate_bsp(workload, method, make(method, network))
    return Prediction(method.name, workload.name, topo.workers, topo.hosts, topo.slots_per_host,
                      workload.batch_size, result.iteration_s, result.compute_s,
                      result.comm_busy_s, result.link_bytes, result.payload_bytes, details)


def _link_rate(network: Network) -> float:
    """The network's link rate in bit/s (from beta), for a trace without congestion."""
    beta = network.params.beta
    return 8.0 / beta if beta > 0 else math.inf
