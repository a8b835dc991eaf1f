"""``auto`` and ``fastest``: the all-reduce algorithm chosen per message size from a cost model
measured on the communicator at its first all-reduce.

At first use the ranks time every candidate algorithm on a few probe sizes (in place, float32,
each repeat after a barrier, the slowest rank's time, the median of the repeats), rank 0
builds the ``CostModel`` and broadcasts it, so every rank picks the same algorithm for every
message (a disagreement would mismatch their messages). The model is cached on the
communicator and, by rank 0, in a file named after the topology (rank count, every rank's
host, the emulated network) in ``DLCOMM_ALLREDUCE_MODEL_CACHE``, so later jobs on the same
machines skip the measurement.

- ``auto`` (the default) chooses between ``ordered`` and ``pipelined``, which give the same
  bits (every element reduced in rank order): the choice changes the time, never the model.
- ``fastest`` also considers ``mpi``, ``ring``, ``rhd`` and, across several hosts,
  ``hierarchical``, whose results depend on the message size and on where a tensor sits in
  a fused buffer: with 3 or more ranks, schedules and fusion thresholds then no longer give
  bit-identical models (docs/collectives.md).

A message is predicted to take the time measured at the nearest probe sizes (interpolated in
log-log), and above the largest probe that time plus the rest at the per-byte cost between
the two largest probes.
"""
from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import math
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlcomm.collectives.buffers import CommLike, check_comm, check_send_recv_pair
from dlcomm.collectives.halving_doubling import rhd_allreduce
from dlcomm.collectives.hierarchical import hierarchical_allreduce
from dlcomm.collectives.mpi_allreduce import mpi_allreduce
from dlcomm.collectives.ordered import (
    ordered_allreduce,
    ordered_reduce_scatter,
    ordered_tcp_allreduce,
    ordered_tcp_reduce_scatter,
)
from dlcomm.collectives.pipelined import (
    check_segment_bytes,
    pipelined_allreduce,
    segment_bytes_from_env,
)
from dlcomm.collectives.reduction import reduction_ufunc
from dlcomm.collectives.ring import ring_allreduce, ring_tcp_allreduce
from dlcomm.comm.mesh_communicator import mesh_communicator
from dlcomm.ops import ReduceOp

# Bump when an algorithm or the probe changes, so cached models of the old code are ignored.
MODEL_VERSION = 2
DETERMINISTIC_CANDIDATES = ("ordered", "pipelined", "ordered_tcp")
ANY_CANDIDATES = ("ordered", "pipelined", "ordered_tcp", "mpi", "ring", "ring_tcp", "rhd",
                  "hierarchical")
PROBE_SIZES = (8 << 10, 256 << 10, 4 << 20)  # bytes of float32
PROBE_REPEATS = (7, 5, 3)  # timed calls per size: more where one call is quick and noisy
MODEL_CACHE_ENV = "DLCOMM_ALLREDUCE_MODEL_CACHE"
CACHE_OFF = "off"

Algorithm = Callable[..., np.ndarray]


def _candidate_functions(segment_bytes: int) -> dict[str, Algorithm]:
    def pipelined(comm: CommLike, send: np.ndarray, recv: np.ndarray,
                  op: ReduceOp | str) -> np.ndarray:
        return pipelined_allreduce(comm, send, recv, op,
                                   allreduce_segment_bytes=segment_bytes)

    return {"ordered": ordered_allreduce, "pipelined": pipelined,
            "ordered_tcp": ordered_tcp_allreduce, "mpi": mpi_allreduce,
            "ring": ring_allreduce, "ring_tcp": ring_tcp_allreduce, "rhd": rhd_allreduce,
            "hierarchical": hierarchical_allreduce}


@dataclasses.dataclass(frozen=True)
class LinearCost:
    """``alpha + beta * nbytes`` seconds: a start-up cost and a cost per byte."""

    alpha: float
    beta: float

    def seconds(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes


def fit_linear(sizes: Sequence[float], seconds: Sequence[float]) -> LinearCost:
    """The ``LinearCost`` closest to the points in relative error (weighted least squares,
    so a small message's microseconds count as much as a large one's milliseconds); alpha
    and beta are kept non-negative."""
    if len(sizes) != len(seconds) or not sizes:
        raise ValueError("need as many times as sizes, and at least one")
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if np.any(y <= 0):
        raise ValueError(f"times must be positive, got {list(seconds)}")
    if len(x) == 1:
        return LinearCost(0.0, float(y[0] / x[0]))
    w = 1.0 / y
    design = np.stack([w, w * x], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, w * y, rcond=None)
    if alpha < 0:
        return LinearCost(0.0, float(np.sum(w * w * x * y) / np.sum(w * w * x * x)))
    if beta < 0:
        return LinearCost(float(np.sum(w * w * y) / np.sum(w * w)), 0.0)
    return LinearCost(float(alpha), float(beta))


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Measured all-reduce times per candidate and probe size, and each candidate's fit."""

    topology: str
    sizes: tuple[int, ...]
    seconds: Mapping[str, tuple[float, ...]]  # candidate -> median time at each probe size

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValueError("a cost model needs at least one candidate")
        if list(self.sizes) != sorted(set(self.sizes)) or not self.sizes:
            raise ValueError(f"probe sizes must be increasing, got {self.sizes}")
        for name, times in self.seconds.items():
            if len(times) != len(self.sizes):
                raise ValueError(f"{name}: {len(times)} times for {len(self.sizes)} sizes")

    @property
    def candidates(self) -> tuple[str, ...]:
        return tuple(self.seconds)

    def cost(self, name: str) -> LinearCost:
        """The fitted ``alpha + beta n`` of one candidate."""
        return fit_linear(self.sizes, self.seconds[name])

    def predict(self, name: str, nbytes: int) -> float:
        """Seconds ``name`` is expected to take for ``nbytes``."""
        sizes, times = self.sizes, self.seconds[name]
        if nbytes <= sizes[0]:
            return times[0]
        if nbytes >= sizes[-1]:
            # The marginal cost between the two largest probes: the whole-range fit weighs
            # the small probes' start-up costs and misjudges large messages.
            slope = self.cost(name).beta if len(sizes) == 1 else max(
                0.0, (times[-1] - times[-2]) / (sizes[-1] - sizes[-2]))
            return times[-1] + slope * (nbytes - sizes[-1])
        i = bisect.bisect_right(sizes, nbytes)
        lo, hi = sizes[i - 1], sizes[i]
        f = (math.log(nbytes) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return math.exp((1 - f) * math.log(times[i - 1]) + f * math.log(times[i]))

    def choose(self, nbytes: int) -> str:
        """The candidate predicted fastest for ``nbytes`` (the first listed on a tie)."""
        return min(self.candidates, key=lambda name: self.predict(name, nbytes))

    def to_json(self) -> dict[str, Any]:
        return {"version": MODEL_VERSION, "topology": self.topology, "sizes": list(self.sizes),
                "seconds": {k: list(v) for k, v in self.seconds.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CostModel:
        if data.get("version") != MODEL_VERSION:
            raise ValueError(f"cost model version {data.get('version')} is not {MODEL_VERSION}")
        return cls(str(data["topology"]), tuple(int(s) for s in data["sizes"]),
                   {str(k): tuple(float(t) for t in v) for k, v in data["seconds"].items()})


def cache_directory(allreduce_model_cache: str | None = None,
                    environ: Mapping[str, str] | None = None) -> Path | None:
    """Where cost models are kept: ``allreduce_model_cache``, or when None
    ``DLCOMM_ALLREDUCE_MODEL_CACHE`` (default ``~/.cache/dlcomm/allreduce``); None when it
    says ``off``."""
    environ = os.environ if environ is None else environ
    text = allreduce_model_cache
    if text is None:
        text = environ.get(MODEL_CACHE_ENV, "")
    if not isinstance(text, str):
        raise TypeError(f"allreduce_model_cache must be a path string, got {text!r}")
    text = text.strip()
    if text.lower() == CACHE_OFF:
        return None
    return Path(text).expanduser() if text else Path.home() / ".cache" / "dlcomm" / "allreduce"


def topology_key(hosts: Sequence[str], candidates: Sequence[str], segment_bytes: int,
                 emulated: str = "") -> str:
    """A file-name-safe name for what the measurement depends on: the rank count, each rank's
    host, the emulated network, the candidates and the pipeline's segment size."""
    text = json.dumps([MODEL_VERSION, list(hosts), emulated, list(candidates), segment_bytes,
                       list(PROBE_SIZES)])
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"p{len(hosts)}-h{len(set(hosts))}-{digest}"


def _read_cached(directory: Path | None, key: str) -> CostModel | None:
    if directory is None:
        return None
    try:
        model = CostModel.from_json(json.loads((directory / f"{key}.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, unreadable or from another version: measure again
    return model if model.topology == key else None


def _write_cached(directory: Path | None, model: CostModel) -> None:
    if directory is None:
        return
    temporary = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=directory, delete=False,
                                         suffix=".tmp") as f:
            temporary = f.name
            json.dump(model.to_json(), f, indent=1)
        # A rename is atomic: a job reading the cache never sees half a file.
        os.replace(temporary, directory / f"{model.topology}.json")
    except OSError:
        if temporary is not None:  # a read-only or full disk: the next job measures again
            Path(temporary).unlink(missing_ok=True)


def measure(comm: CommLike, algorithms: Mapping[str, Algorithm],
            sizes: Sequence[int] = PROBE_SIZES,
            repeats: Sequence[int] = PROBE_REPEATS) -> dict[str, tuple[float, ...]]:
    """Median over ``repeats[j]`` calls of the slowest rank's time of each algorithm at size
    ``sizes[j]`` (in-place float32 sums of zeros, one untimed call first, algorithms taking
    turns call by call so a burst of load hits all alike). Collective; every rank returns
    the same times."""
    comm = check_comm(comm)
    if len(repeats) != len(sizes) or min(repeats, default=0) < 1:
        raise ValueError(f"need one positive repeat count per size, got {list(repeats)}")
    local = np.zeros((len(algorithms), len(sizes), max(repeats)), dtype=np.float64)
    for j, nbytes in enumerate(sizes):
        buf = np.zeros(max(1, nbytes // 4), dtype=np.float32)
        for algorithm in algorithms.values():
            algorithm(comm, buf, buf, ReduceOp.SUM)
        for k in range(repeats[j]):
            for i, algorithm in enumerate(algorithms.values()):
                comm.barrier()
                start = time.perf_counter()
                algorithm(comm, buf, buf, ReduceOp.SUM)
                local[i, j, k] = time.perf_counter() - start
    slowest = np.empty_like(local)
    comm.allreduce(local.reshape(-1), slowest.reshape(-1), ReduceOp.MAX)
    return {name: tuple(max(statistics.median(slowest[i, j, :repeats[j]]), 1e-9)
                        for j in range(len(sizes)))
            for i, name in enumerate(algorithms)}


class AutoAllreduce:
    """The per-size choice among ``candidates`` on one communicator, built collectively: from
    the file cache, or by measuring. Settings left None come from ``DLCOMM_ALLREDUCE_*``;
    call it like ``HierarchicalAllreduce``: ``auto(sendbuf, recvbuf, op)``."""

    def __init__(self, comm: CommLike, candidates: Sequence[str] = DETERMINISTIC_CANDIDATES,
                 *, allreduce_segment_bytes: int | None = None,
                 allreduce_model_cache: str | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.comm = check_comm(comm)
        environ = os.environ if environ is None else environ
        self.segment_bytes = (segment_bytes_from_env(environ) if allreduce_segment_bytes is None
                              else check_segment_bytes(allreduce_segment_bytes))
        functions = _candidate_functions(self.segment_bytes)
        hosts = self.comm.allgather(socket.gethostname())
        names = [c for c in candidates if c != "hierarchical"
                 or 1 < len(set(hosts)) < len(hosts)]  # it needs hosts with several ranks
        if mesh_communicator(self.comm, environ) is None:  # off, or a rank could not connect
            names = [c for c in names if c not in ("ordered_tcp", "ring_tcp")]
        unknown = sorted(set(names) - set(functions))
        if unknown:
            raise ValueError(f"unknown candidate all-reduce(s) {unknown}")
        self.functions = {name: functions[name] for name in names}
        key = topology_key(hosts, names, self.segment_bytes, environ.get("DLCOMM_EMULATE", ""))
        directory = cache_directory(allreduce_model_cache, environ)
        cached = _read_cached(directory, key) if self.comm.rank == 0 else None
        data = self.comm.bcast_object(None if cached is None else cached.to_json())
        self.measured = data is None
        if data is None:
            model = CostModel(key, tuple(PROBE_SIZES), measure(self.comm, self.functions))
            data = self.comm.bcast_object(model.to_json() if self.comm.rank == 0 else None)
            if self.comm.rank == 0:
                _write_cached(directory, model)
        self.model = CostModel.from_json(data)
        self._choices: dict[int, str] = {}

    def choose(self, nbytes: int) -> str:
        """The algorithm for a message of ``nbytes`` (the same on every rank)."""
        name = self._choices.get(nbytes)
        if name is None:
            if len(self._choices) > 4096:  # sizes of one training run repeat; others may not
                self._choices.clear()
            name = self._choices[nbytes] = self.model.choose(nbytes)
        return name

    def __call__(self, sendbuf: np.ndarray, recvbuf: np.ndarray,
                 op: ReduceOp | str = ReduceOp.SUM) -> np.ndarray:
        """All-reduce with the algorithm chosen for this size; same contract as the flat
        algorithms (every rank must pass the same size, or ranks may pick different
        algorithms: the engine's negotiation guarantees it)."""
        reduction_ufunc(op)
        send, recv = check_send_recv_pair(sendbuf, recvbuf)
        return self.functions[self.choose(recv.nbytes)](self.comm, send, recv, op)


def cached_auto_allreduce(comm: CommLike, candidates: Sequence[str] = DETERMINISTIC_CANDIDATES
                          ) -> AutoAllreduce:
    """The ``AutoAllreduce`` of ``comm`` for ``candidates`` (settings from the environment),
    built on first use and cached on the communicator (collective the first time)."""
    comm = check_comm(comm)
    segment = segment_bytes_from_env()
    return comm.cached((AutoAllreduce, tuple(candidates), segment),
                       lambda: AutoAllreduce(comm, candidates, allreduce_segment_bytes=segment))


def built_model(comm: CommLike) -> CostModel | None:
    """The cost model ``auto`` measured (or read) for ``comm``, or None before its first
    all-reduce, or when another algorithm runs. Never collective."""
    comm = check_comm(comm)
    auto = comm.peek_cached((AutoAllreduce, DETERMINISTIC_CANDIDATES, segment_bytes_from_env()))
    if auto is None:
        auto = comm.peek_cached((AutoAllreduce, ANY_CANDIDATES, segment_bytes_from_env()))
    return None if auto is None else auto.model


def auto_allreduce(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray,
                   op: ReduceOp | str = ReduceOp.SUM) -> np.ndarray:
    """All-reduce with ``ordered`` or ``pipelined``, whichever the cost model predicts faster
    for this size: ``ordered``'s bits either way. The first call on a communicator measures
    (or reads the cached model). Returns ``recvbuf``."""
    return _checked(comm, sendbuf, recvbuf, op, DETERMINISTIC_CANDIDATES)


def auto_reduce_scatter(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray,
                        counts: Sequence[int], op: ReduceOp | str = ReduceOp.SUM) -> np.ndarray:
    """``auto``'s reduce-scatter: rank-order bits like its all-reduce, over the TCP mesh
    where the cost model sends an all-reduce of the same bytes there (known once ``auto``
    ran on ``comm``; every rank holds the same model, so all choose alike), else over
    MPI. Returns ``recvbuf``."""
    model = built_model(comm)
    nbytes = int(np.asarray(sendbuf).nbytes)
    if model is not None and model.choose(nbytes) in ("ordered_tcp", "ring_tcp"):
        return ordered_tcp_reduce_scatter(comm, sendbuf, recvbuf, counts, op)
    return ordered_reduce_scatter(comm, sendbuf, recvbuf, counts, op)


def fastest_allreduce(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray,
                      op: ReduceOp | str = ReduceOp.SUM) -> np.ndarray:
    """All-reduce with whichever algorithm the cost model predicts fastest for this size,
    ``mpi``, ``ring``, ``rhd`` and ``hierarchical`` included: results equal to float
    tolerance, not bit for bit across sizes and fusions. Returns ``recvbuf``."""
    return _checked(comm, sendbuf, recvbuf, op, ANY_CANDIDATES)


def _checked(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp | str,
             candidates: Sequence[str]) -> np.ndarray:
    """Arguments checked before the first call's collective measurement can start."""
    comm = check_comm(comm)
    reduction_ufunc(op)
    check_send_recv_pair(sendbuf, recvbuf)
    return cached_auto_allreduce(comm, candidates)(sendbuf, recvbuf, op)
