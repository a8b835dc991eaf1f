"""Calibration of the simulator's network model: the fit recovers known parameters."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from dlcomm.tools.simulate import collectives
from dlcomm.tools.simulate.calibrate import (
    Measurement,
    fit,
    fit_compressor_costs,
    format_fit,
    load_measurements,
    measurements_from_result,
    topology_of,
)
from dlcomm.tools.simulate.network import CostParams, Topology

TRUE = CostParams(overhead=3e-4, alpha=4e-5, beta=8.4e-9, gamma=1.2e-9, alpha_local=1e-5,
                  beta_local=5e-10)
SIZES = (4096, 65536, 1 << 20, 1 << 24, 1 << 26)
# What the campaign measures: shared memory (2, 4 ranks), 2, 4, 8 hosts and 2 hosts x 2.
TOPOLOGIES = (Topology(1, 2), Topology(1, 4), Topology(2), Topology(4), Topology(8),
              Topology(2, 2))


def synthetic(params: CostParams, noise: float = 0.0, seed: int = 0,
              topologies=TOPOLOGIES, collectives=("allreduce", "allgather", "reducescatter"),
              algorithms=("ordered", "ring", "rhd", "tree", "hierarchical"),
              reduce_scatters=("ordered", "ring")) -> list[Measurement]:
    """What the campaign measures: every all-reduce algorithm, the engine's reduce-scatter
    under ordered and MPI's (under ring), and the all-gather (MPI's under any)."""
    rng = np.random.default_rng(seed)
    out = []
    per_kind = {"allreduce": algorithms, "reducescatter": reduce_scatters,
                "allgather": ("ordered",)}
    for topo in topologies:
        for kind in collectives:
            for algo in per_kind[kind]:
                for n in SIZES:
                    m = Measurement(kind, n, topo, 1.0, algo)
                    t = m.cost().seconds(params) * (1 + noise * rng.standard_normal())
                    out.append(dataclasses.replace(m, seconds=t))
    return out


def test_fit_recovers_known_parameters() -> None:
    result = fit(synthetic(TRUE))
    for name, value in TRUE.to_dict().items():
        assert getattr(result.params, name) == pytest.approx(value, rel=1e-6), name
    assert result.warnings == ()
    assert result.rms_relative_error < 1e-9


def test_fit_is_robust_to_noise() -> None:
    result = fit(synthetic(TRUE, noise=0.02, seed=1))
    for name in ("overhead", "alpha", "beta", "gamma", "beta_local"):
        assert getattr(result.params, name) == pytest.approx(getattr(TRUE, name), rel=0.15), name
    assert result.rms_relative_error < 0.05


def test_unidentifiable_parameters_are_fixed_and_named() -> None:
    # one rank count, all-reduce only: overhead ~ alpha and gamma ~ beta cannot be told apart
    only = synthetic(TRUE, topologies=(Topology(4),), collectives=("allreduce",),
                     algorithms=("ring",))
    result = fit(only)
    text = " ".join(result.warnings)
    assert "alpha_local" in text and "beta_local" in text
    assert "gamma" in text and "overhead" in text
    assert result.params.gamma == 0 and result.params.overhead == 0
    # ... but what was measured is still predicted exactly
    assert result.rms_relative_error < 1e-9


def test_priors_fix_parameters() -> None:
    result = fit(synthetic(TRUE), priors={"gamma": 1.2e-9, "overhead": 3e-4})
    assert result.params.gamma == 1.2e-9 and "gamma" not in result.fitted
    assert result.params.beta == pytest.approx(TRUE.beta, rel=1e-6)
    with pytest.raises(ValueError, match="unknown priors"):
        fit(synthetic(TRUE), priors={"latency": 1.0})
    with pytest.raises(ValueError, match="no measurements"):
        fit([])


def bench_json(kind: str, ranks: int, emulate: str, rows: list[tuple[int, float]]) -> dict:
    """What `dlcomm bench <kind> --json` writes (the fields calibration reads)."""
    return {"benchmark": kind, "ranks": ranks, "emulate": emulate,
            "rows": [{"bytes": b, "dlcomm": {"median_s": t}, "mpi4py": {"median_s": t / 2}}
                     for b, t in rows]}


def test_bench_files_and_campaign_files(tmp_path: Path) -> None:
    paths = []
    for i, m in enumerate(synthetic(TRUE, topologies=(Topology(4), Topology(2, 2)),
                                    algorithms=("ordered", "ring"))):
        emulate = f"{m.topology.hosts}x1gbit"
        data = bench_json(m.collective, m.topology.workers, emulate,
                          [(int(m.nbytes), m.seconds)])
        # the campaign wraps the bench JSON with its setup; a bare bench file ran with
        # the engine's default algorithm, ordered
        if i % 2 or m.algorithm != "ordered":
            data = {"setup": {"emulate": emulate, "allreduce_algorithm": m.algorithm},
                    "result": data}
        path = tmp_path / f"m{i}.json"
        path.write_text(json.dumps(data))
        paths.append(path)
    loaded = load_measurements(paths)
    assert {m.topology for m in loaded} == {Topology(4), Topology(2, 2)}
    result = fit(loaded)
    assert result.params.beta == pytest.approx(TRUE.beta, rel=1e-6)
    assert "| allreduce | ring | 2x2 |" in format_fit(result)
    assert "| reducescatter | ordered | 2x2 |" in format_fit(result)
    # the raw peer runs MPI's own collectives whatever the run's algorithm
    raw = load_measurements(paths[:1], peer="mpi4py", algorithm="ring")
    assert raw[0].seconds == pytest.approx(loaded[0].seconds / 2)
    with pytest.raises(ValueError, match="--algorithm ring"):
        load_measurements(paths[:1], peer="mpi4py")
    scatter = [p for p, m in zip(paths, loaded) if m.collective == "reducescatter"]
    assert {m.algorithm for m in load_measurements(scatter, peer="mpi4py")} == {"mpi"}


def test_topology_and_refusals() -> None:
    assert topology_of({"ranks": 8, "emulate": "4x1gbit"}) == Topology(4, 2)
    assert topology_of({"ranks": 4, "emulate": ""}) == Topology(1, 4)
    with pytest.raises(ValueError, match="evenly"):
        topology_of({"ranks": 6, "emulate": "4x1gbit"})
    for name in ("native", "mpi"):
        mpi = {"setup": {"allreduce_algorithm": name},
               "result": bench_json("allreduce", 4, "4x1gbit", [(4096, 1e-3)])}
        with pytest.raises(ValueError, match="DLCOMM_ALLREDUCE_ALGORITHM=ordered"):
            measurements_from_result(mpi)
        # MPI's own reduce-scatter is the ring the model has
        mpi["result"]["benchmark"] = "reducescatter"
        (m,) = measurements_from_result(mpi)
        assert m.algorithm == "mpi"
        assert m.cost() == collectives.ring_reduce_scatter(4096, Topology(4))
    with pytest.raises(ValueError, match="algorithm must be one of"):
        measurements_from_result({"setup": {"allreduce_algorithm": "nccl"},
                                  "result": bench_json("allreduce", 2, "", [])})
    with pytest.raises(ValueError, match="not a `dlcomm bench`"):
        measurements_from_result({"rows": []})
    with pytest.raises(ValueError, match="peer"):
        measurements_from_result(bench_json("allreduce", 2, "", []), peer="horovod")
    with pytest.raises(ValueError, match="no model"):
        Measurement("alltoall", 10, Topology(2), 1.0).cost()


def test_ordered_measurements_use_the_ordered_model() -> None:
    topo = Topology(2, 2)
    n = 4 * 1_000_001
    ar = Measurement("allreduce", n, topo, 1.0, "ordered")
    assert ar.cost() == collectives.ordered_allreduce(n, topo)
    rs = Measurement("reducescatter", n, topo, 1.0, "ordered")
    assert rs.cost() == collectives.ordered_reduce_scatter(n, topo)
    assert Measurement("reducescatter", n, topo, 1.0, "ring").cost() == \
        collectives.ring_reduce_scatter(n, topo)
    assert Measurement("allreduce", n, topo, 1.0).algorithm == "ordered"  # the default
    # the element size comes from the bench row: float16 blocks are whole 2-byte elements
    half = bench_json("reducescatter", 4, "2x1gbit", [(n + 2, 1e-3)])
    half["rows"][0]["dtype"] = "float16"
    (m,) = measurements_from_result(half)
    assert (m.algorithm, m.itemsize) == ("ordered", 2)
    assert m.cost() == collectives.ordered_reduce_scatter(n + 2, topo, itemsize=2)


def test_ordered_alone_with_the_all_gather_recovers_the_parameters() -> None:
    only = synthetic(TRUE, algorithms=("ordered",), reduce_scatters=("ordered",))
    result = fit(only)
    for name, value in TRUE.to_dict().items():
        assert getattr(result.params, name) == pytest.approx(value, rel=1e-6), name
    assert result.warnings == ()


def test_compressor_costs_are_fitted_over_dense() -> None:
    rows = []
    for n in (1 << 18, 1 << 20, 1 << 22):
        rows.append({"spec": "none", "elements": n, "seconds": 1e-5 + 1e-9 * n})
        rows.append({"spec": "topk:ratio=0.01", "elements": n, "seconds": 3e-5 + 5e-9 * n})
        rows.append({"spec": "memcpy", "elements": n, "seconds": 5e-10 * n})
    costs = fit_compressor_costs(rows)
    assert set(costs) == {"topk:ratio=0.01"}
    assert costs["topk:ratio=0.01"].per_tensor_s == pytest.approx(2e-5)
    assert costs["topk:ratio=0.01"].per_element_s == pytest.approx(4e-9)
