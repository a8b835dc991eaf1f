"""The cost model behind ``auto``/``fastest``: fitting, prediction, choice, its file cache and
topology key, and the pipelined all-reduce's segmentation. (The measurement itself and the
agreement across ranks run on real ranks in tests/multirank/test_allreduce_auto.py.)"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dlcomm.collectives import cost_model, pipelined
from dlcomm.collectives.cost_model import CostModel, LinearCost, fit_linear


def test_fit_recovers_an_exact_line_and_stays_non_negative() -> None:
    sizes = [1e3, 1e5, 1e7]
    cost = fit_linear(sizes, [2e-4 + 1e-9 * n for n in sizes])
    assert cost.alpha == pytest.approx(2e-4, rel=1e-6)
    assert cost.beta == pytest.approx(1e-9, rel=1e-6)
    # Times that fall with size would need a negative slope: beta is clamped to 0.
    flat = fit_linear(sizes, [3e-3, 2e-3, 1e-3])
    assert flat.beta == 0.0 and flat.alpha > 0
    # Times growing faster than linearly from zero would need a negative start-up cost.
    steep = fit_linear(sizes, [1e-9, 1e-6, 1e-2])
    assert steep.alpha == 0.0 and steep.beta > 0
    assert fit_linear([100], [1e-3]) == LinearCost(0.0, 1e-5)
    with pytest.raises(ValueError, match="positive"):
        fit_linear(sizes, [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="as many"):
        fit_linear(sizes, [1.0])


def _model() -> CostModel:
    # "small" wins at the smallest probe, "big" at the largest; they cross in between.
    return CostModel("key", (1_000, 100_000, 10_000_000),
                     {"small": (1e-4, 1e-3, 1e-1), "big": (1e-3, 2e-3, 5e-2)})


def test_prediction_interpolates_measured_points_and_extrapolates_by_the_last_slope() -> None:
    model = _model()
    assert model.predict("small", 10) == 1e-4  # below the smallest probe: its time
    assert model.predict("small", 100_000) == pytest.approx(1e-3)
    middle = model.predict("small", 10_000)  # half way in log size: geometric mean
    assert middle == pytest.approx(math.sqrt(1e-4 * 1e-3))
    beyond = model.predict("big", 20_000_000)  # the slope between the two largest probes
    assert beyond == pytest.approx(5e-2 + (5e-2 - 2e-3) / (10_000_000 - 100_000) * 10_000_000)
    # The case that moved it there: a start-up-heavy algorithm (the TCP mesh) whose fit over
    # all probes has the same per-byte cost as the others, but whose large messages are
    # faster (measured on the emulated 1 Gbit/s links).
    measured = CostModel("k", (8192, 262144, 4194304),
                         {"ordered": (0.00099, 0.00397, 0.0924),
                          "ordered_tcp": (0.00271, 0.0128, 0.0641)})
    assert measured.choose(64 << 20) == "ordered_tcp"
    assert measured.choose(8192) == "ordered"
    assert model.choose(1_000) == "small" and model.choose(10_000_000) == "big"
    assert model.choose(10**9) == "big"
    tie = CostModel("k", (10,), {"first": (1.0,), "second": (1.0,)})
    assert tie.choose(10) == "first"


def test_model_round_trips_through_json_and_refuses_other_versions() -> None:
    model = _model()
    assert CostModel.from_json(json.loads(json.dumps(model.to_json()))) == model
    data = model.to_json() | {"version": cost_model.MODEL_VERSION + 1}
    with pytest.raises(ValueError, match="version"):
        CostModel.from_json(data)
    with pytest.raises(ValueError, match="increasing"):
        CostModel("k", (10, 5), {"a": (1.0, 1.0)})
    with pytest.raises(ValueError, match="2 sizes"):
        CostModel("k", (5, 10), {"a": (1.0,)})
    with pytest.raises(ValueError, match="at least one"):
        CostModel("k", (5,), {})


def test_cache_directory_follows_the_knob(tmp_path: Path) -> None:
    assert cost_model.cache_directory(environ={}) == Path.home() / ".cache/dlcomm/allreduce"
    env = {"DLCOMM_ALLREDUCE_MODEL_CACHE": str(tmp_path)}
    assert cost_model.cache_directory(environ=env) == tmp_path
    assert cost_model.cache_directory(environ={"DLCOMM_ALLREDUCE_MODEL_CACHE": "OFF"}) is None
    assert cost_model.cache_directory("off", environ=env) is None  # the argument wins
    with pytest.raises(TypeError, match="path string"):
        cost_model.cache_directory(3, environ={})


def test_cache_files_are_written_whole_and_bad_ones_ignored(tmp_path: Path) -> None:
    model = CostModel("p4-h1-abc", (1, 2), {"ordered": (1e-3, 2e-3)})
    cost_model.write_cached(tmp_path / "new", model)
    assert cost_model.read_cached(tmp_path / "new", "p4-h1-abc") == model
    assert list((tmp_path / "new").iterdir()) == [tmp_path / "new" / "p4-h1-abc.json"]
    assert cost_model.read_cached(tmp_path / "new", "p4-h1-other") is None
    (tmp_path / "new" / "p4-h1-bad.json").write_text("{not json")
    assert cost_model.read_cached(tmp_path / "new", "p4-h1-bad") is None
    assert cost_model.read_cached(None, "p4-h1-abc") is None
    cost_model.write_cached(None, model)  # 'off': nothing written, no error
    blocked = tmp_path / "file"
    blocked.write_text("")
    cost_model.write_cached(blocked / "sub", model)  # cannot create: silently skipped


def test_topology_key_names_what_the_measurement_depends_on() -> None:
    key = cost_model.topology_key(["a", "a", "b", "b"], ["ordered", "pipelined"], 1 << 20)
    assert key.startswith("p4-h2-")
    assert key == cost_model.topology_key(["a", "a", "b", "b"], ["ordered", "pipelined"],
                                         1 << 20)
    others = [cost_model.topology_key(["a", "b", "a", "b"], ["ordered", "pipelined"], 1 << 20),
              cost_model.topology_key(["a", "a", "b", "b"], ["ordered"], 1 << 20),
              cost_model.topology_key(["a", "a", "b", "b"], ["ordered", "pipelined"], 1 << 19),
              cost_model.topology_key(["a", "a", "b", "b"], ["ordered", "pipelined"], 1 << 20,
                                     "2x1gbit"),
              cost_model.topology_key(["a", "a", "b", "b"], ["ordered", "pipelined"], 1 << 20,
                                     mpi_wait="block")]  # a model per DLCOMM_MPI_WAIT
    assert len({key, *others}) == 6


def test_segments_cover_a_block_and_the_knob_is_checked() -> None:
    assert pipelined.segment_bounds(0, 4) == []
    assert pipelined.segment_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert pipelined.segment_bounds(3, 4) == [(0, 3)]
    assert pipelined.segment_bytes_from_env({}) == pipelined.DEFAULT_SEGMENT_BYTES
    assert pipelined.segment_bytes_from_env({"DLCOMM_ALLREDUCE_SEGMENT_BYTES": "256k"}) \
        == 256 << 10
    with pytest.raises(ValueError, match="DLCOMM_ALLREDUCE_SEGMENT_BYTES"):
        pipelined.segment_bytes_from_env({"DLCOMM_ALLREDUCE_SEGMENT_BYTES": "0"})
    for bad in (0, -1, 1.5, True, "1M"):
        with pytest.raises(ValueError, match="segment_bytes"):
            pipelined.check_segment_bytes(bad)
