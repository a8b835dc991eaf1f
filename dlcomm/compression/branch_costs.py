"""Measured cost of exchanging a tensor through each of several compressors, per tensor size.

A choice among compressors (``hierarchy_choice``) times every candidate end to end on the
communicator it will run on: compress, every round, decompress, error feedback included,
through the driver that training uses (``exchange.run_rounds``). Two probe sizes, the
candidates alternated within each repeat so that a drift of the machine's speed hits them
alike, the fastest of the repeats (the probe runs while training computes on the same cores,
which only ever adds time, and more to the candidate with more rounds; the large exchanges
it predicts run once backward is done), and the slowest rank's time, gathered so that every
rank holds the same numbers and so makes the same choice for every tensor.

``cached_branch_costs`` keeps the result in a file named after what it depends on (each
rank's host, the emulated network, the candidates), in ``DLCOMM_COMPRESSION_COST_CACHE``:
later jobs on the same hosts read it instead of measuring, so they choose alike.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlcomm import cache_files
from dlcomm.array_api import from_host
from dlcomm.compression.base import Compressor
from dlcomm.compression.exchange import ExchangeComm, run_rounds
from dlcomm.config import knob_value

CACHE_KNOB = "compression_cost_cache"
CACHE_VERSION = 2  # bump when the probe or the candidates' code changes what they cost

PROBE_NAME = "__dlcomm_branch_probe__"
PROBE_ELEMENTS = (1 << 16, 1 << 20)  # float elements; at least the bypass size (see probe_sizes)
PROBE_REPEATS = 5  # timed exchanges per candidate and size, after one untimed


@dataclass(frozen=True)
class BranchCosts:
    """Seconds per exchange of each candidate at each probe size (the slowest rank's fastest),
    and a straight line through them for any size. The same on every rank."""

    sizes: tuple[int, ...]
    seconds: Mapping[str, tuple[float, ...]]

    def __post_init__(self) -> None:
        if len(self.sizes) != 2 or self.sizes[0] >= self.sizes[1]:
            raise ValueError(f"need two increasing probe sizes, got {self.sizes}")
        for name, times in self.seconds.items():
            if len(times) != 2 or min(times) <= 0:
                raise ValueError(f"{name}: need two positive times, got {times}")

    def predict(self, name: str, elements: int) -> float:
        """Seconds to exchange a tensor of ``elements`` through candidate ``name``: the line
        through the two probes (flat beyond them where the line would fall, never below 0)."""
        (n1, n2), (t1, t2) = self.sizes, self.seconds[name]
        slope = max(0.0, (t2 - t1) / (n2 - n1))
        return max(0.0, (t1 if slope == 0 else t1 + slope * (elements - n1)))

    def cheapest(self, elements: int) -> str:
        """The candidate predicted fastest for ``elements`` (the first listed on a tie)."""
        return min(self.seconds, key=lambda name: self.predict(name, elements))

    def to_json(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes),
                "seconds": {name: list(times) for name, times in self.seconds.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BranchCosts:
        """What ``to_json`` wrote; ValueError (or KeyError, TypeError) on anything else."""
        return cls(tuple(int(n) for n in data["sizes"]),
                   {str(name): tuple(float(t) for t in times)
                    for name, times in data["seconds"].items()})


def probe_sizes(min_compress_size: int) -> tuple[int, int]:
    """Probe sizes large enough to be compressed (not bypassed) by the candidates, in whole
    rows of 64 (the probes are 2-D, as the weights that get compressed)."""
    small = -(-max(PROBE_ELEMENTS[0], min_compress_size) // 64) * 64
    return small, max(PROBE_ELEMENTS[1], 16 * small)


def measure_branch_costs(candidates: Mapping[str, Compressor], comm: ExchangeComm,
                         like: object, sizes: Sequence[int] | None = None,
                         repeats: int = PROBE_REPEATS) -> BranchCosts:
    """Time each candidate exchanging probe tensors of ``like``'s dtype and array kind over
    ``comm`` (collective: every rank calls it at the same point with the same candidates).
    Each candidate's state for the probe is dropped afterwards."""
    if not candidates:
        raise ValueError("need at least one candidate compressor")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if sizes is None:
        sizes = probe_sizes(max(c.min_compress_size for c in candidates.values()))
    if any(n % 64 or n <= 0 for n in sizes):
        raise ValueError(f"probe sizes must be positive multiples of 64, got {list(sizes)}")
    rng = np.random.default_rng(1 + comm.rank)
    measured: dict[str, list[float]] = {name: [] for name in candidates}
    for n in sizes:
        probe = from_host(rng.standard_normal((n // 64, 64)).astype(like.dtype), like)
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        for repeat in range(1 + repeats):
            for name, compressor in candidates.items():  # alternated within each repeat
                start = time.perf_counter()
                run_rounds([(compressor, probe, PROBE_NAME)], comm, True)
                if repeat:
                    samples[name].append(time.perf_counter() - start)
        for name, compressor in candidates.items():
            compressor.reset_state(PROBE_NAME)
            measured[name].append(min(samples[name]))
    mine = np.array([t for name in candidates for t in measured[name]], dtype=np.float64)
    slowest = np.max(np.stack([np.asarray(r) for r in comm.allgather(mine)]), axis=0)
    count = len(sizes)
    return BranchCosts(tuple(int(n) for n in sizes), {
        name: tuple(float(t) for t in slowest[i * count:(i + 1) * count])
        for i, name in enumerate(candidates)})


def cache_directory(setting: str | None = None) -> Path | None:
    """Where measured costs are kept: ``setting``, else ``DLCOMM_COMPRESSION_COST_CACHE``
    (default ``~/.cache/dlcomm/compression``); None when it says ``off``."""
    if setting is not None and not isinstance(setting, (str, os.PathLike)):
        raise TypeError(f"{CACHE_KNOB} must be a path string, got {setting!r}")
    text = knob_value(CACHE_KNOB, None if setting is None else str(setting))
    return cache_files.cache_directory(str(text), "compression")


def cache_key(hosts: Sequence[str], candidates: Mapping[str, Compressor], dtype: Any,
              sizes: Sequence[int], context: Sequence[Any] = ()) -> str:
    """A file name for what a measurement depends on: each rank's host, the candidates'
    specs, the dtype and probe sizes, the emulated network, and ``context`` (the caller's:
    e.g. how ranks group into hosts)."""
    text = json.dumps([CACHE_VERSION, list(hosts), os.environ.get("DLCOMM_EMULATE", ""),
                       {name: c.describe() for name, c in candidates.items()},
                       np.dtype(dtype).str, list(sizes), list(context)])
    return (f"p{len(hosts)}-h{len(set(hosts))}-"
            f"{hashlib.sha256(text.encode()).hexdigest()[:16]}")


def cached_branch_costs(candidates: Mapping[str, Compressor], comm: Any, like: object,
                        context: Sequence[Any] = (), setting: str | None = None
                        ) -> BranchCosts:
    """``measure_branch_costs`` through the file cache (collective; ``comm`` must gather
    Python objects, as the transport's communicators do): rank 0 reads the file and every
    rank takes its costs; without one, every rank measures and rank 0 writes the file."""
    directory = cache_directory(setting)
    sizes = probe_sizes(max(c.min_compress_size for c in candidates.values()))
    hosts = comm.allgather(socket.gethostname())
    key = cache_key(hosts, candidates, like.dtype, sizes, context)
    path = None if directory is None else directory / f"{key}.json"
    found = comm.allgather(_read(path, set(candidates)) if comm.rank == 0 else None)[0]
    if found is not None:
        return BranchCosts.from_json(found)
    costs = measure_branch_costs(candidates, comm, like, sizes)
    if comm.rank == 0 and path is not None:
        cache_files.write_json_atomic(path, costs.to_json())
    return costs


def _read(path: Path | None, names: set[str]) -> dict[str, Any] | None:
    """The cached costs' JSON if the file holds costs of exactly these candidates."""
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        costs = BranchCosts.from_json(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, unreadable or another version: measure again
    return data if set(costs.seconds) == names else None

