"""A training method as dlcomm runs it: compression, all-reduce algorithm, schedule,
synchronisation (BSP, DS-Sync, LB-BSP) and DLCP's loss tolerance, with dlcomm's knob names.

``Method.parse("acpsgd:rank=4 schedule=wfbp algorithm=ring")``: whitespace-separated items,
each ``knob=value`` (knobs: the fields below) or a bare word that names itself: a schedule
(``dear``), an all-reduce algorithm (``hierarchical``; ``ordered``, the engine's, by
default; ``native`` is accepted for ``mpi``), a sync spec (``dssync:group_size=2``,
``lbbsp``), ``dense`` or a compressor spec (``topk:ratio=0.01``). A bare ``none`` is refused:
dlcomm uses it for a schedule and for a compressor (write ``schedule=none`` or ``dense``).
The combinations dlcomm refuses are refused here (DeAR with compression, DS-Sync or DLCP
with a schedule other than ``wfbp``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from dlcomm.tools.simulate.collectives import ALLREDUCE_ALGORITHMS, FLAT_ALGORITHMS
from dlcomm.tools.simulate.compressors import CompressorModel

SCHEDULES = ("wfbp", "mgwfbp", "dear", "none")  # dlcomm's names (frameworks/torch/schedules)
# dlcomm's DLCOMM_ALLREDUCE_ALGORITHM values; "mpi" (MPI's own) is modelled as the faster
# of ring and halving-doubling at each size, and "auto" (the engine's default) as the faster
# of its candidates at each size (AUTO_CANDIDATES), as its measured cost model picks.
AUTO = "auto"
ALGORITHMS = (*ALLREDUCE_ALGORITHMS, "mpi", AUTO)
# Mirrored from dlcomm.collectives.registry (importing it starts MPI; a test checks they
# agree): earlier names still accepted. `pipelined` moves ordered's bytes in rank order and
# is charged as `ordered` (its overlap of segments is not modelled: an upper bound).
ALGORITHM_ALIASES = {"native": "mpi", "pipelined": "ordered"}
# dlcomm.collectives.selection.DETERMINISTIC_CANDIDATES without `pipelined` (as `ordered`).
AUTO_CANDIDATES = ("ordered", "ordered_tcp")
DEFAULT_ALGORITHM = AUTO  # the engine's default
DEFAULT_FUSION_THRESHOLD = 64 << 20  # DLCOMM_FUSION_THRESHOLD's default
DEFAULT_DEAR_BUCKET_SIZE = 4 << 20  # DLCOMM_DEAR_BUCKET_SIZE's default
DEFAULT_MIN_COMPRESS_SIZE = 1024  # DLCOMM_MIN_COMPRESS_SIZE's default


@dataclasses.dataclass(frozen=True)
class SyncSpec:
    """``bsp``, ``dssync`` (``group_size``) or ``lbbsp`` (``interval``, ``predictor``,
    ``min_batch``, ``max_batch_factor``: a rank's batch may grow to that multiple of the even
    share, as the demo allows; the global batch is workers x the workload's batch)."""

    kind: str = "bsp"
    group_size: int = 0
    interval: int = 8
    max_batch_factor: float = 4.0
    min_batch: int = 1
    predictor: str = "ema"

    @classmethod
    def parse(cls, text: str) -> SyncSpec:
        """``bsp``, ``dssync:group_size=S``, ``lbbsp[:interval=8,max_batch_factor=4]``."""
        head, _, rest = text.strip().partition(":")
        kind = head.strip().lower()
        items = dict(_pairs(rest, f"sync {text!r}"))
        if kind == "bsp" and not items:
            return cls()
        if kind == "dssync":
            unknown = set(items) - {"group_size", "seed", "cycle"}
            if unknown or "group_size" not in items:
                raise ValueError(f"sync {text!r}: dssync needs group_size=S (seed and cycle "
                                 "change nothing in time)")
            size = int(items["group_size"])
            if size < 1:
                raise ValueError(f"sync {text!r}: group_size must be >= 1")
            return cls("dssync", group_size=size)
        if kind == "lbbsp":
            unknown = set(items) - {"interval", "max_batch_factor", "min_batch", "predictor"}
            if unknown:
                raise ValueError(f"sync {text!r}: the simulator takes interval, predictor, "
                                 "min_batch and max_batch_factor (the global batch is workers "
                                 f"x the batch size), not {sorted(unknown)}")
            spec = cls("lbbsp", interval=int(items.get("interval", 8)),
                       max_batch_factor=float(items.get("max_batch_factor", 4.0)),
                       min_batch=int(items.get("min_batch", 1)),
                       predictor=items.get("predictor", "ema"))
            if spec.interval < 1 or spec.max_batch_factor < 1 or spec.min_batch < 0:
                raise ValueError(f"sync {text!r}: need interval >= 1, max_batch_factor >= 1, "
                                 "min_batch >= 0")
            if spec.predictor not in ("ema", "narx", "narx-ridge"):
                raise ValueError(f"sync {text!r}: predictor must be ema, narx or narx-ridge")
            return spec
        raise ValueError(f"unknown sync {text!r}: use bsp, dssync:group_size=S or lbbsp")

    def __str__(self) -> str:
        if self.kind == "dssync":
            return f"dssync:group_size={self.group_size}"
        if self.kind == "lbbsp" and self.predictor != "ema":
            return f"lbbsp:predictor={self.predictor}"
        return self.kind


def _pairs(text: str, what: str) -> list[tuple[str, str]]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{what}: expected key=value, got {item!r}")
        out.append((key.strip(), value.strip()))
    return out


@dataclasses.dataclass(frozen=True)
class Method:
    """What one worker does with its gradients each iteration (dlcomm's knobs)."""

    compression: str = "none"
    algorithm: str = DEFAULT_ALGORITHM
    schedule: str = "wfbp"
    sync: SyncSpec = SyncSpec()
    loss_tolerance: float = 0.0
    fusion_threshold: int = DEFAULT_FUSION_THRESHOLD
    leader_algorithm: str = "ring"
    dear_bucket_size: int = DEFAULT_DEAR_BUCKET_SIZE
    min_compress_size: int = DEFAULT_MIN_COMPRESS_SIZE
    compress_1d: bool = False
    label: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.sync, str):
            object.__setattr__(self, "sync", SyncSpec.parse(self.sync))
        compressor = CompressorModel.parse(self.compression)  # ValueError on a bad spec
        algorithm = normalize_algorithm(self.algorithm)
        object.__setattr__(self, "algorithm", algorithm)
        if self.leader_algorithm not in FLAT_ALGORITHMS:
            raise ValueError(f"leader_algorithm must be one of {FLAT_ALGORITHMS}, got "
                             f"{self.leader_algorithm!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; valid: "
                             f"{', '.join(SCHEDULES)}")
        lt = self.loss_tolerance
        if isinstance(lt, bool) or not isinstance(lt, (int, float)) or not math.isfinite(lt) \
                or not 0 <= lt < 1:
            raise ValueError(f"loss_tolerance must be in [0, 1), got {lt!r}")
        for name in ("fusion_threshold", "dear_bucket_size", "min_compress_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.schedule == "dear" and not compressor.is_dense:
            raise ValueError("schedule dear takes no compression (as in dlcomm): use wfbp, "
                             "mgwfbp or none with a compressor")
        if (self.sync.kind == "dssync" or lt > 0) and self.schedule != "wfbp":
            raise ValueError("DS-Sync and loss_tolerance > 0 replace the all-reduce schedule "
                             "(as in dlcomm): leave schedule at wfbp")
        if lt > 0 and self.sync.kind != "bsp":
            raise ValueError("loss_tolerance applies to sync=bsp only (as in dlcomm)")
        if self.sync.kind == "lbbsp" and self.schedule not in ("wfbp", "none"):
            raise ValueError("LB-BSP takes schedule wfbp or none (as in dlcomm)")
        if self.sync.kind != "bsp" and not compressor.is_dense:
            raise ValueError("the simulator models DS-Sync and LB-BSP with dense gradients")
        if lt > 0 and not compressor.is_dense:
            raise ValueError("loss_tolerance > 0 runs DLCP's exchange of dense gradients")

    @property
    def compressor(self) -> CompressorModel:
        """The parsed compression spec."""
        return CompressorModel.parse(self.compression)

    @property
    def name(self) -> str:
        """The label, or a short description built from the knobs that differ from dlcomm's
        defaults."""
        if self.label:
            return self.label
        parts = ["dense" if self.compression == "none" else self.compression]
        if self.sync.kind != "bsp":
            parts.append(str(self.sync))
        if self.loss_tolerance:
            parts.append(f"dlcp:p={self.loss_tolerance:g}")
        if self.schedule != "wfbp":
            parts.append(self.schedule)
        if self.algorithm != DEFAULT_ALGORITHM:
            parts.append(self.algorithm)
        return " ".join(parts)

    @classmethod
    def parse(cls, text: str, **defaults: Any) -> Method:
        """A method from ``knob=value`` items and self-describing words (module doc)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("method must be a non-empty string such as 'dense' or "
                             "'acpsgd:rank=4 schedule=wfbp'")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = dict(defaults)
        for item in text.split():
            key, eq, value = item.partition("=")
            if eq and ":" not in key and key.replace("-", "_") in fields:
                name = key.replace("-", "_")
                if name in ("fusion_threshold", "dear_bucket_size", "min_compress_size"):
                    values[name] = _size(value)
                elif name == "loss_tolerance":
                    values[name] = float(value)
                elif name == "compress_1d":
                    values[name] = value in ("1", "true", "True")
                else:
                    values[name] = value
            elif item == "none":
                raise ValueError("'none' is both a schedule and a compressor in dlcomm: write "
                                 "'dense' (no compression) or 'schedule=none'")
            elif item == "dense":
                values["compression"] = "none"
            elif item in SCHEDULES:
                values["schedule"] = item
            elif item in ALGORITHMS or item in ALGORITHM_ALIASES:
                values["algorithm"] = item
            elif item.split(":")[0] in ("bsp", "dssync", "lbbsp"):
                values["sync"] = item
            else:
                values["compression"] = item
        return cls(**values)


def normalize_algorithm(name: str) -> str:
    """An all-reduce algorithm's current name (``native`` -> ``mpi``, case-insensitive);
    ValueError listing the valid names otherwise."""
    if not isinstance(name, str):
        raise ValueError(f"algorithm must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    key = ALGORITHM_ALIASES.get(key, key)
    if key not in ALGORITHMS:
        aliases = ", ".join(f"{a} = {b}" for a, b in ALGORITHM_ALIASES.items())
        raise ValueError(f"algorithm must be one of {ALGORITHMS} (also {aliases}), got "
                         f"{name!r}")
    return key


def _size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1] if t and t[-1] in "kmg" else ""
    try:
        return int(float(t[:-1] if unit else t) * units[unit])
    except ValueError:
        raise ValueError(f"bad size {text!r}: use bytes, or 4K, 64M") from None
