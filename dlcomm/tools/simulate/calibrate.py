"""Fit the network model to measured collectives: ``dlcomm bench allreduce|allgather|
reducescatter|broadcast --json`` runs (on shared memory and under ``dlcommrun --emulate``).

Every measured row becomes the row of a design matrix: the coefficients of the collective's
``Cost`` for its size and topology (``collectives.py``, the formulas prediction uses), and
the measured median time. The parameters are the non-negative least-squares solution that
minimises the *relative* error (rows divided by their time, so microsecond and second
measurements count alike). A parameter the measurements cannot pin down (a column of zeros,
or a combination of columns that is constant across rows, e.g. ``overhead`` and ``alpha``
when only one rank count was measured) is fixed (at 0, or at a prior given with
``priors=``) and named in ``warnings``.

A bench JSON's topology: ``emulate`` (``"4x1gbit"`` -> 4 hosts) and ``ranks`` give hosts and
slots per host; without ``emulate`` all ranks share one host. The all-reduce algorithm is
not in the bench JSON: it comes from ``setup.allreduce_algorithm`` of a file the
measurement campaign wrote (``campaign.py``, which sets ``DLCOMM_ALLREDUCE_ALGORITHM`` in
every job) or from ``algorithm=`` (default ``ordered``, the engine's default). It decides
the model of ``allreduce`` rows and of ``reducescatter`` rows (the engine's reduce-scatter
is the ordered one under ``ordered``, MPI's own, modelled as a ring, under the others);
``allgather`` is MPI's under every algorithm. ``ordered`` has no parameters of its own: its
all-to-all and all-gather are messages (``alpha``, ``beta`` or their in-host pair) and its
reduction in rank order is ``gamma``. MPI's own all-reduce (``mpi``, ``native``) changes
algorithm with size and rank count and is refused.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlcomm.tools.simulate import collectives
from dlcomm.tools.simulate.compressors import MeasuredCost
from dlcomm.tools.simulate.methods import AUTO, normalize_algorithm
from dlcomm.tools.simulate.network import PARAM_NAMES, Cost, CostParams, Topology

PEERS = ("dlcomm", "mpi4py")
_EMULATE_RE = re.compile(r"^\s*(\d+)x", re.IGNORECASE)
# Fixed first when the measurements leave parameters unidentified (the last is kept longest).
UNIDENTIFIED_ORDER = ("gamma", "overhead", "alpha_local", "beta_local", "alpha", "beta")

# A bench file that records no algorithm is read as ``ordered`` (as before the simulator
# modelled ``auto``).
RECORDLESS_ALGORITHM = "ordered"


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One measured collective: kind, bytes (the bench's size convention), topology,
    all-reduce algorithm (``DLCOMM_ALLREDUCE_ALGORITHM`` of the run), the median seconds,
    and the bytes per element (``ordered`` splits buffers into whole elements)."""

    collective: str
    nbytes: float
    topology: Topology
    seconds: float
    algorithm: str = RECORDLESS_ALGORITHM
    source: str = ""
    itemsize: int = collectives.DEFAULT_ITEMSIZE

    def cost(self) -> Cost:
        """The model's linear form for this measurement."""
        topo = self.topology
        if self.collective == "allreduce":
            if self.algorithm == "ordered":
                return collectives.ordered_allreduce(self.nbytes, topo, self.itemsize)
            if self.algorithm == "ordered_tcp":
                return collectives.ordered_tcp_allreduce(self.nbytes, topo, self.itemsize)
            return collectives.allreduce(self.algorithm, self.nbytes, topo)
        if self.collective == "allgather":  # size = the gathered output
            return collectives.ring_allgather(self.nbytes / topo.workers, topo)
        if self.collective == "reducescatter":  # size = the input
            if self.algorithm == "ordered":
                return collectives.ordered_reduce_scatter(self.nbytes, topo, self.itemsize)
            if self.algorithm == "ordered_tcp":
                return collectives.ordered_tcp_reduce_scatter(self.nbytes, topo, self.itemsize)
            return collectives.ring_reduce_scatter(self.nbytes, topo)
        if self.collective == "broadcast":
            return collectives.binomial_broadcast(self.nbytes, topo)
        raise ValueError(f"calibration has no model of {self.collective!r} (use allreduce, "
                         "allgather, reducescatter or broadcast)")


def topology_of(result: Mapping[str, Any]) -> Topology:
    """Hosts x slots of a bench result (``emulate`` and ``ranks``, or a campaign ``setup``)."""
    setup = result.get("setup", {}) or {}
    ranks = int(result["ranks"])
    if "hosts" in setup:
        return Topology.for_workers(ranks, ranks // int(setup["hosts"]))
    emulate = result.get("emulate") or setup.get("emulate") or ""
    m = _EMULATE_RE.match(emulate)
    hosts = int(m.group(1)) if m else 1
    if ranks % hosts:
        raise ValueError(f"{ranks} ranks do not fill {hosts} emulated hosts evenly")
    return Topology.for_workers(ranks, ranks // hosts)


def measurements_from_result(result: Mapping[str, Any], *, peer: str = "dlcomm",
                             algorithm: str | None = None, source: str = "",
                             min_bytes: float = 0.0) -> list[Measurement]:
    """The rows of one ``dlcomm bench <collective> --json`` result (optionally wrapped by the
    campaign as ``{"setup": ..., "result": ...}``) as measurements of ``peer``. The raw
    ``mpi4py`` peer always runs MPI's own collectives, whatever the run's algorithm: its
    all-reduce rows need ``algorithm=`` to say which model stands for MPI's choice."""
    if peer not in PEERS:
        raise ValueError(f"peer must be one of {PEERS}, got {peer!r}")
    setup = dict(result.get("setup", {}) or {})
    inner = result.get("result", result)
    if "benchmark" not in inner or "rows" not in inner:
        raise ValueError(f"{source or 'result'}: not a `dlcomm bench` collective JSON (needs "
                         "'benchmark' and 'rows')")
    ran = "mpi" if peer == "mpi4py" else setup.get("allreduce_algorithm")
    algo = normalize_algorithm(algorithm or ran or RECORDLESS_ALGORITHM)
    if algo == AUTO and inner["benchmark"] in ("allreduce", "reducescatter"):
        raise ValueError(f"{source}: measured with auto, which picks its algorithm per size "
                         "from its own measurement, so no one formula fits it; measure with "
                         "DLCOMM_ALLREDUCE_ALGORITHM=ordered_tcp or ordered (or ring, rhd, "
                         "tree, hierarchical), or give --algorithm")
    if algo == "mpi" and inner["benchmark"] == "allreduce":
        if peer == "mpi4py":
            raise ValueError(f"{source}: the mpi4py peer times MPI's own all-reduce, whose "
                             "algorithm the model does not know; give --algorithm ring (or "
                             "rhd) to fit it as that, or leave out the all-reduce files")
        raise ValueError(f"{source}: measured with MPI's own all-reduce (mpi, formerly "
                         "native), whose algorithm the model does not know; measure with "
                         "DLCOMM_ALLREDUCE_ALGORITHM=ordered (or ring, rhd, tree, "
                         "hierarchical)")
    topo = topology_of({**inner, "setup": setup})
    out = []
    for row in inner["rows"]:
        figures = row.get(peer, {})
        if "median_s" not in figures or row["bytes"] < min_bytes:
            continue
        itemsize = np.dtype(row.get("dtype") or inner.get("dtype") or "float32").itemsize
        out.append(Measurement(inner["benchmark"], float(row["bytes"]), topo,
                               float(figures["median_s"]), algo, source, itemsize))
    return out


def load_measurements(paths: Iterable[str | Path], *, peer: str = "dlcomm",
                      algorithm: str | None = None, min_bytes: float = 0.0
                      ) -> list[Measurement]:
    """Measurements from bench JSON files (skipping collectives without a model)."""
    out: list[Measurement] = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        inner = data.get("result", data)
        if inner.get("benchmark") == "alltoall":
            continue
        out += measurements_from_result(data, peer=peer, algorithm=algorithm,
                                        source=str(path), min_bytes=min_bytes)
    return out


@dataclasses.dataclass(frozen=True)
class Fit:
    """Fitted parameters, which were fixed and why, and the per-measurement residuals."""

    params: CostParams
    fitted: tuple[str, ...]
    fixed: Mapping[str, float]
    warnings: tuple[str, ...]
    residuals: tuple[Mapping[str, Any], ...]

    @property
    def rms_relative_error(self) -> float:
        """Root mean square of (predicted - measured) / measured."""
        errs = [r["relative_error"] for r in self.residuals]
        return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON written by ``dlcomm simulate calibrate`` (``params`` is what predict reads)."""
        return {"params": self.params.to_dict(), "fitted": list(self.fitted),
                "fixed": dict(self.fixed), "warnings": list(self.warnings),
                "rms_relative_error": self.rms_relative_error,
                "residuals": [dict(r) for r in self.residuals]}


def _solve_nonnegative(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """min ||design x - target|| with x >= 0 (columns scaled to unit norm for conditioning)."""
    from scipy.optimize import lsq_linear

    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    sol = lsq_linear(design / scale, target, bounds=(0.0, np.inf), method="bvls",
                     tol=1e-12, lsmr_tol="auto")
    return sol.x / scale


def fit(measurements: Sequence[Measurement], *, priors: Mapping[str, float] | None = None
        ) -> Fit:
    """Fit ``CostParams`` to ``measurements`` (see the module doc)."""
    if not measurements:
        raise ValueError("no measurements to fit")
    priors = dict(priors or {})
    unknown = set(priors) - set(PARAM_NAMES)
    if unknown:
        raise ValueError(f"unknown priors {sorted(unknown)}; parameters: {list(PARAM_NAMES)}")
    rows = np.array([m.cost().coefficients() for m in measurements], dtype=np.float64)
    times = np.array([m.seconds for m in measurements], dtype=np.float64)
    if np.any(~np.isfinite(times)) or np.any(times <= 0):
        raise ValueError("measured times must be finite and > 0")
    weighted = rows / times[:, None]
    free = [i for i, name in enumerate(PARAM_NAMES) if name not in priors]
    warnings: list[str] = []
    fixed = dict(priors)
    for i in list(free):
        if not np.any(weighted[:, i]):
            free.remove(i)
            fixed[PARAM_NAMES[i]] = 0.0
            warnings.append(f"{PARAM_NAMES[i]}: no measurement depends on it; fixed at 0")
    order = [PARAM_NAMES.index(n) for n in UNIDENTIFIED_ORDER]
    while free:
        cols = weighted[:, free]
        cols = cols / np.linalg.norm(cols, axis=0)
        if np.linalg.matrix_rank(cols, tol=1e-9) == len(free):
            break
        drop = next(i for i in order if i in free)
        free.remove(drop)
        fixed[PARAM_NAMES[drop]] = 0.0
        warnings.append(f"{PARAM_NAMES[drop]}: not separable from the other parameters with "
                        "these measurements (e.g. overhead and alpha need several rank counts, "
                        "gamma needs all-gather or reduce-scatter runs beside all-reduce); "
                        "fixed at 0")
    known = np.array([fixed.get(n, 0.0) for n in PARAM_NAMES])
    target = 1.0 - weighted @ known
    values = known.copy()
    if free:
        values[free] = _solve_nonnegative(weighted[:, free], target)
    params = CostParams(**{n: float(v) for n, v in zip(PARAM_NAMES, values)})
    predicted = rows @ values
    residuals = tuple({
        "source": m.source, "collective": m.collective, "algorithm": m.algorithm,
        "hosts": m.topology.hosts, "slots_per_host": m.topology.slots_per_host,
        "bytes": m.nbytes, "measured_s": m.seconds, "predicted_s": float(p),
        "relative_error": float(p / m.seconds - 1.0)} for m, p in zip(measurements, predicted))
    return Fit(params, tuple(PARAM_NAMES[i] for i in free),
               {k: v for k, v in fixed.items()}, tuple(warnings), residuals)


def format_fit(result: Fit) -> str:
    """A Markdown summary: parameters, warnings and the measured/predicted table."""
    p = result.params
    lines = ["| parameter | value | |", "|---|---:|---|"]
    units = {"overhead": "s per call", "alpha": "s per message", "beta": "s per byte",
             "gamma": "s per byte reduced", "alpha_local": "s per message (in a host)",
             "beta_local": "s per byte (in a host)"}
    for name in PARAM_NAMES:
        how = "fitted" if name in result.fitted else "fixed"
        lines.append(f"| {name} | {getattr(p, name):.4g} | {units[name]}, {how} |")
    if p.beta > 0:
        lines.append(f"| (link rate) | {8 / p.beta / 1e9:.3f} Gbit/s | 8 / beta |")
    lines += [""] + [f"- {w}" for w in result.warnings]
    lines += ["", "| collective | algorithm | hosts x slots | bytes | measured ms | predicted ms "
              "| error |", "|---|---|---|---:|---:|---:|---:|"]
    for r in result.residuals:
        lines.append(f"| {r['collective']} | {r['algorithm']} | {r['hosts']}x"
                     f"{r['slots_per_host']} | {int(r['bytes'])} | {r['measured_s'] * 1e3:.3f} "
                     f"| {r['predicted_s'] * 1e3:.3f} | {r['relative_error']:+.1%} |")
    lines.append(f"\nRMS relative error: {result.rms_relative_error:.1%}")
    return "\n".join(lines) + "\n"


# --- compressor costs ----------------------------------------------------------------------

def fit_compressor_costs(rows: Sequence[Mapping[str, Any]]) -> dict[str, MeasuredCost]:
    """Per spec, ``seconds = per_tensor_s + per_element_s * elements`` fitted on the rows
    of ``dlcomm.tools.bench.compression_throughput.measure_throughput`` (one rank's compress and
    decompress), minus the same fit of ``none`` (the averaging every spec does)."""
    by_spec: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        by_spec.setdefault(str(r["spec"]), []).append((float(r["elements"]), float(r["seconds"])))

    def line(points: list[tuple[float, float]]) -> tuple[float, float]:
        x = np.array([p[0] for p in points])
        y = np.array([p[1] for p in points])
        if len(np.unique(x)) < 2:
            return 0.0, float(np.mean(y / x))
        slope, intercept = np.polyfit(x, y, 1)
        return max(float(intercept), 0.0), max(float(slope), 0.0)

    base = line(by_spec["none"]) if "none" in by_spec else (0.0, 0.0)
    out = {}
    for spec, points in by_spec.items():
        if spec in ("none", "memcpy"):
            continue
        a, b = line(points)
        out[spec] = MeasuredCost(max(a - base[0], 0.0), max(b - base[1], 0.0))
    return out


def measure_compressor_costs(sizes: Sequence[int], specs: Sequence[str], repeats: int
                             ) -> dict[str, Any]:
    """Run dlcomm's compressor throughput benchmark and fit it (a timing: run it on a quiet
    machine). Returns the JSON ``--compressor-costs`` reads."""
    from dlcomm.tools.bench.compression_throughput import measure_throughput

    specs = list(dict.fromkeys(["none", *specs]))
    rows = measure_throughput(sizes, specs, repeats)
    costs = fit_compressor_costs(rows)
    return {"compressors": {k: dataclasses.asdict(v) for k, v in costs.items()},
            "rows": rows}
