"""The measured cost of all-reduce algorithms on one communicator: times at a few probe sizes,
a prediction for any size, and a file cache keyed by the topology.

``measured_model`` is the collective entry point: rank 0 reads the cache or the ranks time
every candidate (in place, float32, each repeat after a barrier, the slowest rank's time,
the median of the repeats), and every rank returns the same ``CostModel``, so every rank
chooses the same algorithm for a message. ``selection`` (``auto``, ``fastest``) and the
hierarchical all-reduce's leaders (``ring`` or ``rhd`` by size) both choose with it.
"""
from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlcomm import cache_files
from dlcomm.collectives.buffers import CommLike, check_comm
from dlcomm.ops import ReduceOp

# Bump when an algorithm or the probe changes, so cached models of the old code are ignored.
MODEL_VERSION = 3
PROBE_SIZES = (8 << 10, 256 << 10, 4 << 20)  # bytes of float32
PROBE_REPEATS = (7, 5, 3)  # timed calls per size: more where one call is quick and noisy
MODEL_CACHE_ENV = "DLCOMM_ALLREDUCE_MODEL_CACHE"

Algorithm = Callable[..., np.ndarray]


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
    return cache_files.cache_directory(text, "allreduce")


def topology_key(hosts: Sequence[str], candidates: Sequence[str], segment_bytes: int,
                 emulated: str = "", mpi_wait: str = "poll") -> str:
    """A file-name-safe name for what the measurement depends on: the rank count, each rank's
    host, the emulated network, the candidates, the pipeline's segment size and how MPI
    calls wait (``DLCOMM_MPI_WAIT``)."""
    text = json.dumps([MODEL_VERSION, list(hosts), emulated, list(candidates), segment_bytes,
                       list(PROBE_SIZES), mpi_wait])
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"p{len(hosts)}-h{len(set(hosts))}-{digest}"


def read_cached(directory: Path | None, key: str) -> CostModel | None:
    if directory is None:
        return None
    try:
        model = CostModel.from_json(json.loads((directory / f"{key}.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, unreadable or from another version: measure again
    return model if model.topology == key else None


def write_cached(directory: Path | None, model: CostModel) -> None:
    if directory is not None:
        cache_files.write_json_atomic(directory / f"{model.topology}.json", model.to_json(),
                                      indent=1)


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


def wait_mode_of(comm: CommLike) -> str:
    """``poll`` or ``block``: how ``comm``'s MPI calls wait (a communicator without MPI
    polls)."""
    return "poll" if getattr(comm, "poll", True) else "block"


def measured_model(comm: CommLike, algorithms: Mapping[str, Algorithm], key: str,
                   directory: Path | None) -> tuple[CostModel, bool]:
    """The cost model of ``algorithms`` on ``comm`` for the topology ``key``: rank 0's cached
    file in ``directory`` when there is one, else measured now and cached. Collective; every
    rank returns the same model, and whether it was measured (True) or read."""
    comm = check_comm(comm)
    cached = read_cached(directory, key) if comm.rank == 0 else None
    data = comm.bcast_object(None if cached is None else cached.to_json())
    if data is not None:
        return CostModel.from_json(data), False
    model = CostModel(key, tuple(PROBE_SIZES), measure(comm, algorithms))
    data = comm.bcast_object(model.to_json() if comm.rank == 0 else None)
    if comm.rank == 0:
        write_cached(directory, model)
    return CostModel.from_json(data), True
