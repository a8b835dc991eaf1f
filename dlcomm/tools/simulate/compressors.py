"""What each of dlcomm's compressors sends per tensor and round, and what it costs to run.

Names, parameters and defaults are dlcomm's own (``dlcomm.compression.registry``: the spec is
parsed there, and the rounds and summability come from the library's compressor), so the
simulator accepts exactly the specs ``DLCOMM_COMPRESSION`` accepts. Payload sizes follow the
compressors' code (tests compare them with real payloads). Compute cost per tensor is either
measured (``python -m dlcomm.tools.bench.compression_throughput`` through
``dlcomm simulate calibrate --compressors``) or estimated from the device: bytes of memory
traffic per element, FLOPs per element and kernel launches per tensor (``COST_MODELS``;
assumptions listed in docs/simulation.md). A round spans every rank unless ``groups`` says
HOST or PEER (``htopk``, whose payloads depend on the shards, one per rank of a host).
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlcomm.tools.simulate.devices import Device
from dlcomm.tools.simulate.workload import Tensor

ALLREDUCE, ALLGATHER, SPARSE_MERGE = "allreduce", "allgather", "sparse_merge"
REDUCE_SCATTER = "reduce_scatter"
# The ranks a round spans (dlcomm.compression.base's groups): all, this rank's host, or the
# ranks with this rank's local rank on every host.
WORLD, HOST, PEER = "world", "host", "peer"

# The defaults of dlcomm's compressor constructors (a test checks them against the library).
DEFAULT_PARAMS: dict[str, dict[str, object]] = {
    "topk": {"ratio": 0.01, "approx": False},
    "randomk": {"ratio": 0.01},
    "gtopk": {"ratio": 0.01},
    "htopk": {"ratio": 0.01},
    "qsgd": {"levels": 16, "bucket": 512},
    "powersgd": {"rank": 4},
    "acpsgd": {"rank": 4},
}


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Per element: bytes of memory traffic and FLOPs (``flops_per_rank`` times the
    low-rank rank); per tensor: kernel launches; per gathered element: bytes of traffic to
    aggregate one rank's payload (all-gather compressors add every rank's part)."""

    bytes_per_element: float
    launches: float
    flops_per_rank: float = 0.0
    gather_bytes_per_element: float = 0.0


# Estimates for one rank's compress + decompress (error feedback included where dlcomm's
# registry turns it on). Exact top-k's selection is the expensive part on GPUs (sort-based).
COST_MODELS: dict[str, CostModel] = {
    "none": CostModel(0.0, 0.0),
    "fp16": CostModel(12.0, 2.0),
    "bf16": CostModel(12.0, 2.0, gather_bytes_per_element=6.0),
    "topk": CostModel(224.0, 6.0, gather_bytes_per_element=12.0),
    "topk-approx": CostModel(40.0, 8.0, gather_bytes_per_element=12.0),
    "randomk": CostModel(24.0, 4.0),
    "gtopk": CostModel(224.0, 8.0),
    # Not measured yet: exact top-k's estimate (selection over all n elements, an upper bound
    # as htopk selects over one shard of n / S; error feedback over n as topk), and adding
    # the other hosts' pairs of a shard (``compute_seconds``).
    "htopk": CostModel(224.0, 6.0, gather_bytes_per_element=12.0),
    "efsignsgd": CostModel(36.0, 6.0, gather_bytes_per_element=8.125),
    "signum": CostModel(12.0, 3.0, gather_bytes_per_element=8.125),
    "qsgd": CostModel(24.0, 5.0, gather_bytes_per_element=9.0),
    "powersgd": CostModel(32.0, 12.0, flops_per_rank=8.0),
    "acpsgd": CostModel(28.0, 7.0, flops_per_rank=6.0),
}


@dataclasses.dataclass(frozen=True)
class MeasuredCost:
    """A fitted ``seconds = per_tensor_s + per_element_s * elements`` for one compressor."""

    per_tensor_s: float
    per_element_s: float


def _index_bytes(numel: int) -> int:
    return 4 if numel < 2**31 else 8


def _k(ratio: float, numel: int) -> int:
    return max(1, min(numel, int(ratio * numel)))


def _level_bytes(levels: int) -> int:
    for size, top in ((1, 127), (2, 32767), (4, 2**31 - 1)):
        if levels <= top:
            return size
    raise ValueError(f"qsgd levels={levels} does not fit in int32")


@dataclasses.dataclass(frozen=True)
class CompressorModel:
    """A parsed compression spec: name, parameters, cast, and the library's rounds."""

    spec: str
    name: str
    params: Mapping[str, object]
    cast: str | None
    rounds: tuple[str, ...]
    summable: bool
    groups: tuple[str, ...] = ()  # per round, the ranks it spans (empty: all of them)
    # topk:hierarchical=auto: the htopk model each tensor may go to instead, whichever the
    # simulator predicts faster for it alone (the library measures; ``messages``)
    alternative: CompressorModel | None = None

    @classmethod
    def parse(cls, spec: str) -> CompressorModel:
        """Parse a ``DLCOMM_COMPRESSION`` spec with dlcomm's own parser."""
        from dlcomm.compression.registry import format_spec, get_compressor, parse_spec

        name, params, cast = parse_spec(spec)
        hierarchical = params.pop("hierarchical", "0")
        if hierarchical != "0":  # topk:...,hierarchical=1 is htopk with the same parameters
            if hierarchical == "auto":
                flat = cls.parse(format_spec("topk", params, cast))
                return dataclasses.replace(flat, spec=spec.strip(),
                                           alternative=cls.parse(format_spec("htopk", params,
                                                                             cast)))
            name, spec = "htopk", format_spec("htopk", params, cast)
        if name not in COST_MODELS:
            raise ValueError(f"the simulator has no model of compressor {name!r}; it models "
                             f"{', '.join(COST_MODELS)}")
        library = get_compressor(spec)
        merged = {**DEFAULT_PARAMS.get(name, {}), **params}
        return cls(spec.strip(), name, merged, cast, tuple(library.rounds), library.summable,
                   tuple(library.groups))

    @property
    def round_groups(self) -> tuple[str, ...]:
        """Per round, the ranks its collective spans: WORLD, HOST or PEER (as the library's
        ``Compressor.groups``)."""
        return self.groups or (WORLD,) * len(self.rounds)

    @property
    def is_dense(self) -> bool:
        """``none``: plain all-reduce."""
        return self.name == "none"

    def applies_to(self, tensor: Tensor, min_compress_size: int = 1024,
                   compress_1d: bool = False) -> bool:
        """dlcomm's bypass: small and (by default) 1-D tensors go dense."""
        if self.is_dense or tensor.numel < max(1, min_compress_size):
            return False
        return len(tensor.shape) >= 2 or compress_1d

    def _value_bytes(self) -> int:
        return 2 if self.cast in ("fp16", "bf16") else 4

    def round_payloads(self, tensor: Tensor, step: int = 0,
                       shards: int = 1) -> list[tuple[str, float]]:
        """(collective kind, bytes one rank contributes) for each round on ``tensor``; the
        group each round spans is ``round_groups``. ``shards`` (the ranks per host) matters
        to ``htopk`` alone, whose bytes are those of local rank 0 (owner of shard 0; other
        owners' differ by at most one element or pair, as shards differ by one element)."""
        n, v = tensor.numel, self._value_bytes()
        p = self.params
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be an int >= 1 (ranks per host), got {shards!r}")
        if self.name == "htopk":
            return _htopk_payloads(float(p["ratio"]), n, v, shards)
        if self.name == "none":
            return [(ALLREDUCE, float(tensor.nbytes))]
        if self.name == "fp16":
            return [(ALLREDUCE, 2.0 * n)]
        if self.name == "bf16":
            return [(ALLGATHER, 2.0 * n)]
        if self.name == "topk":
            k = _k(float(p["ratio"]), n)
            return [(ALLGATHER, float(k * (v + _index_bytes(n))))]
        if self.name == "randomk":
            return [(ALLREDUCE, float(_k(float(p["ratio"]), n) * v))]
        if self.name == "gtopk":
            k = _k(float(p["ratio"]), n)
            return [(SPARSE_MERGE, float(k * (v + _index_bytes(n)))), (ALLREDUCE, float(k * v))]
        if self.name == "efsignsgd":
            return [(ALLGATHER, float(math.ceil(n / 8) + v))]
        if self.name == "signum":
            return [(ALLGATHER, float(math.ceil(n / 8)))]
        if self.name == "qsgd":  # one norm per bucket of elements, a level per element
            norms = math.ceil(n / int(p["bucket"]))
            return [(ALLGATHER, float(norms * v + n * _level_bytes(int(p["levels"]))))]
        rows, cols = tensor.matrix_shape
        r = min(int(p["rank"]), rows, cols)
        if self.name == "powersgd":
            return [(ALLREDUCE, float(rows * r * v)), (ALLREDUCE, float(cols * r * v))]
        if self.name == "acpsgd":  # P on even steps, Q on odd ones
            return [(ALLREDUCE, float((rows if step % 2 == 0 else cols) * r * v))]
        raise AssertionError(self.name)

    def _cost_key(self) -> str:
        return "topk-approx" if self.name == "topk" and self.params.get("approx") else self.name

    def _measured(self, measured: Mapping[str, MeasuredCost]) -> MeasuredCost | None:
        """This spec's measured cost, else one measured for the same compressor (another
        ratio or rank: the cost per element barely depends on it)."""
        if self.spec in measured:
            return measured[self.spec]
        from dlcomm.compression.registry import parse_spec

        for spec, cost in measured.items():
            try:
                name, params, _ = parse_spec(spec)
            except ValueError:
                continue
            if name == self.name and bool(params.get("approx", False)) == \
                    bool(self.params.get("approx", False)):
                return cost
        return None

    def compute_seconds(self, tensor: Tensor, workers: int, device: Device,
                        measured: Mapping[str, MeasuredCost] | None = None,
                        shards: int = 1) -> float:
        """One rank's compress + decompress of ``tensor`` (and the aggregation of every
        rank's payload for all-gather compressors) on ``device``, or from ``measured``
        (keyed by spec) when it holds this compressor. ``shards`` (ranks per host) matters
        to ``htopk``: a shard's owner adds the pairs of the ``workers / shards - 1`` other
        hosts."""
        if self.is_dense:
            return 0.0
        model = COST_MODELS[self._cost_key()]
        gathered = 0.0
        shards = max(int(shards), 1)
        others = max(workers // shards, 1) - 1 if self.name == "htopk" else workers - 1
        if model.gather_bytes_per_element and others > 0:
            ratio = float(self.params.get("ratio", 0.0))
            if self.name == "topk":
                elements = _k(ratio, tensor.numel)
            elif self.name == "htopk":  # the pairs of one shard from every other host
                elements = _k(ratio, max(tensor.numel // shards, 1))
            else:
                elements = tensor.numel
            gathered = device.seconds_for(
                0.0, model.gather_bytes_per_element * elements * others)
        found = self._measured(measured) if measured else None
        if found is not None:
            return found.per_tensor_s + found.per_element_s * tensor.numel + gathered
        rank = int(self.params.get("rank", 0) or 0)
        flops = model.flops_per_rank * rank * tensor.numel
        return (model.launches * device.launch_s
                + device.seconds_for(flops, model.bytes_per_element * tensor.numel) + gathered)


def _htopk_payloads(ratio: float, n: int, v: int, shards: int) -> list[tuple[str, float]]:
    """htopk's rounds for local rank 0 (dlcomm.compression.htopk): the whole tensor into the
    host's reduce-scatter, the ``k`` indices of its shard to the host, ``k`` pairs to its
    peers, its dense shard sum to the host. Shard 0 has ``n // shards`` elements (empty, and
    nothing selected, when ``n < shards``)."""
    length = n // shards  # shard_bounds: shard j is [n j // shards, n (j + 1) // shards)
    k = _k(ratio, length) if length else 0
    index = _index_bytes(n)  # indices are flat positions in the whole tensor
    return [(REDUCE_SCATTER, float(n * v)), (ALLGATHER, float(k * index)),
            (ALLGATHER, float(k * (v + index))), (ALLGATHER, float(length * v))]


def load_measured_costs(path: str | Path) -> dict[str, MeasuredCost]:
    """Read the JSON ``dlcomm simulate calibrate --compressors`` writes."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    try:
        return {spec: MeasuredCost(float(v["per_tensor_s"]), float(v["per_element_s"]))
                for spec, v in data["compressors"].items()}
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a compressor-cost JSON ({exc})") from None
