"""``topk:hierarchical=0|1|auto`` in one process: the spec, the cost lines the choice is made
with, the measurement's bookkeeping, and the errors. The choice on real ranks is in
tests/multirank/test_compression_hierarchy_choice.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dlcomm.compression import SelfComm, compressed_allreduce, get_compressor
from dlcomm.compression.branch_costs import (
    PROBE_NAME,
    BranchCosts,
    measure_branch_costs,
    probe_sizes,
)
from dlcomm.compression.dense_start import DenseStart
from dlcomm.compression.error_feedback import ErrorFeedback
from dlcomm.compression.hierarchy_choice import HierarchyChoice
from dlcomm.compression.htopk import HierarchicalTopK


def test_costs_predict_along_the_line_through_the_probes():
    costs = BranchCosts((100, 1100), {"topk": (0.001, 0.011), "htopk": (0.004, 0.006)})
    assert costs.predict("topk", 100) == pytest.approx(0.001)
    assert costs.predict("topk", 600) == pytest.approx(0.006)
    assert costs.predict("htopk", 2100) == pytest.approx(0.008)
    # topk: 1e-5 s per element, htopk 2e-6: they cross at 100 + 0.003 / 8e-6 = 475.
    assert costs.cheapest(470) == "topk" and costs.cheapest(480) == "htopk"
    assert costs.cheapest(10**7) == "htopk"


def test_a_falling_line_is_flat_and_times_never_go_negative():
    costs = BranchCosts((100, 200), {"topk": (0.003, 0.002), "htopk": (0.001, 0.009)})
    assert costs.predict("topk", 10**6) == pytest.approx(0.003)
    assert costs.predict("htopk", 0) == 0.0
    tie = BranchCosts((100, 200), {"topk": (1.0, 1.0), "htopk": (1.0, 1.0)})
    assert tie.cheapest(150) == "topk"


@pytest.mark.parametrize("sizes,seconds", [
    ((100,), {"topk": (1.0,)}), ((200, 100), {"topk": (1.0, 2.0)}),
    ((100, 200), {"topk": (1.0, 0.0)}), ((100, 200), {"topk": (1.0,)}),
])
def test_bad_costs_are_refused(sizes, seconds):
    with pytest.raises(ValueError):
        BranchCosts(sizes, seconds)


def test_probes_are_never_bypassed_and_whole_rows():
    assert probe_sizes(0) == (1 << 16, 1 << 20)
    small, large = probe_sizes(100_001)
    assert small >= 100_001 and small % 64 == 0 and large >= 16 * small


def test_measuring_times_every_candidate_and_drops_the_probe_state():
    candidates = {"topk": get_compressor("topk:ratio=0.1"),
                  "htopk": get_compressor("htopk:ratio=0.1")}
    costs = measure_branch_costs(candidates, SelfComm(), np.zeros(1, np.float32),
                                 sizes=(64 * 16, 64 * 64), repeats=1)
    assert costs.sizes == (1024, 4096) and set(costs.seconds) == {"topk", "htopk"}
    assert all(t > 0 for times in costs.seconds.values() for t in times)
    assert all(PROBE_NAME not in c.states for c in candidates.values())


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"repeats": True}, {"sizes": (100, 200)}])
def test_bad_measurement_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        measure_branch_costs({"topk": get_compressor("topk")}, SelfComm(),
                             np.zeros(1, np.float32), **kwargs)


def test_the_spec_builds_flat_hierarchical_or_the_choice():
    assert get_compressor("topk:hierarchical=0").describe() == "topk:ratio=0.01,approx=0"
    one = get_compressor("topk:ratio=0.1,approx=1,hierarchical=1")
    assert isinstance(one, ErrorFeedback) and isinstance(one.inner, HierarchicalTopK)
    assert one.describe() == "htopk:ratio=0.1,approx=1"
    auto = get_compressor("topk:ratio=0.1,mc=0,hierarchical=auto")
    assert isinstance(auto, HierarchyChoice)
    assert auto.describe() == "topk:ratio=0.1,approx=0,mc=0,hierarchical=auto"
    assert get_compressor(auto.describe()).describe() == auto.describe()
    late = get_compressor("topk:hierarchical=auto,start_iter=2")
    assert isinstance(late, DenseStart) and isinstance(late.inner, HierarchyChoice)
    assert get_compressor(late.describe()).describe() == late.describe()


@pytest.mark.parametrize("spec", ["topk:hierarchical=2", "topk:hierarchical=yes",
                                  "gtopk:hierarchical=auto", "topk:hierarchical=auto+fp16"])
def test_bad_hierarchy_specs_are_refused(spec):
    with pytest.raises(ValueError):
        get_compressor(spec)


def test_one_rank_is_flat_top_k_and_measures_nothing():
    auto = get_compressor("topk:ratio=0.1,hierarchical=auto")
    flat = get_compressor("topk:ratio=0.1")
    for step in range(3):
        x = np.random.default_rng(step).standard_normal((40, 30)).astype(np.float32)
        assert np.array_equal(compressed_allreduce(auto, x, "w", SelfComm()),
                              compressed_allreduce(flat, x, "w", SelfComm()))
    assert auto.choices == {"w": "topk"} and auto.costs is None
    assert "w" in auto.flat.states and not auto.hierarchical.states


def test_the_choice_is_not_a_compressor_to_drive_directly():
    auto = get_compressor("topk:hierarchical=auto")
    x = np.ones((40, 30), np.float32)
    with pytest.raises(TypeError, match="for_tensor"):
        auto.compress(x, "w")
    with pytest.raises(TypeError, match="for_tensor"):
        _ = auto.rounds
    assert not auto.summable


def test_bad_candidates_and_checkpoints_are_refused():
    flat, hier = get_compressor("topk"), get_compressor("htopk")
    with pytest.raises(TypeError):
        HierarchyChoice(flat, object())
    with pytest.raises(ValueError):
        HierarchyChoice(flat, get_compressor("none"))
    with pytest.raises(ValueError):
        HierarchyChoice(flat, hier, costs=BranchCosts((1, 2), {"topk": (1.0, 2.0)}))
    auto = HierarchyChoice(flat, hier)
    with pytest.raises(ValueError, match="flat"):
        auto.load_state_dict(flat.state_dict())


def test_momentum_and_reset_reach_both_candidates():
    auto = get_compressor("topk:ratio=0.1,hierarchical=auto")
    auto.set_momentum(0.9)
    assert auto.flat.momentum == auto.hierarchical.momentum == 0.9
    compressed_allreduce(auto, np.ones((40, 30), np.float32), "w", SelfComm())
    auto.reset_state("w")
    assert not auto.choices and "w" not in auto.flat.states


class _ObjectSelfComm(SelfComm):
    """One rank whose all-gather takes any object, as the transport's communicators do."""

    def allgather(self, obj: object) -> list:
        return [obj]


def _candidates():
    return {"topk": get_compressor("topk:ratio=0.1"), "htopk": get_compressor("htopk:ratio=0.1")}


def test_costs_survive_json():
    costs = BranchCosts((64, 1024), {"topk": (0.001, 0.003), "htopk": (0.002, 0.0025)})
    assert BranchCosts.from_json(json.loads(json.dumps(costs.to_json()))) == costs


def test_the_cache_is_written_once_and_read_by_later_jobs(tmp_path, monkeypatch):
    from dlcomm.compression import branch_costs

    like = np.zeros(1, np.float32)
    first = branch_costs.cached_branch_costs(_candidates(), _ObjectSelfComm(), like,
                                             setting=str(tmp_path))
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and files[0].name.startswith("p1-h1-")

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured although the cache holds the costs")

    monkeypatch.setattr(branch_costs, "measure_branch_costs", no_measuring)
    again = branch_costs.cached_branch_costs(_candidates(), _ObjectSelfComm(), like,
                                             setting=str(tmp_path))
    assert again == first
    # Another spec, dtype, host grouping or emulated network is another file: measured.
    for args, env in [((get_compressor("topk:ratio=0.2"),), {}), ((), {"dtype": np.float64}),
                      ((), {"context": (2, 2, 0)}), ((), {"emulate": "4x1gbit"})]:
        candidates = _candidates()
        if args:
            candidates["topk"] = args[0]
        if "emulate" in env:
            monkeypatch.setenv("DLCOMM_EMULATE", env["emulate"])
        with pytest.raises(AssertionError, match="measured"):
            branch_costs.cached_branch_costs(
                candidates, _ObjectSelfComm(), np.zeros(1, env.get("dtype", np.float32)),
                context=env.get("context", ()), setting=str(tmp_path))
        monkeypatch.delenv("DLCOMM_EMULATE", raising=False)


def test_a_bad_or_foreign_cache_file_is_measured_again(tmp_path):
    from dlcomm.compression import branch_costs

    like = np.zeros(1, np.float32)
    branch_costs.cached_branch_costs(_candidates(), _ObjectSelfComm(), like,
                                     setting=str(tmp_path))
    (path,) = tmp_path.glob("*.json")
    for text in ["not json", json.dumps({"sizes": [1, 2], "seconds": {"a": [1.0, 2.0]}}),
                 json.dumps({"sizes": [2, 1], "seconds": {"topk": [1.0, 2.0]}})]:
        path.write_text(text)
        costs = branch_costs.cached_branch_costs(_candidates(), _ObjectSelfComm(), like,
                                                 setting=str(tmp_path))
        assert set(costs.seconds) == {"topk", "htopk"}
        assert BranchCosts.from_json(json.loads(path.read_text())) == costs


def test_off_or_an_unwritable_cache_measures_and_keeps_nothing(tmp_path):
    from dlcomm.compression import branch_costs

    like = np.zeros(1, np.float32)
    costs = branch_costs.cached_branch_costs(_candidates(), _ObjectSelfComm(), like,
                                             setting="off")
    assert set(costs.seconds) == {"topk", "htopk"}
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    costs = branch_costs.cached_branch_costs(_candidates(), _ObjectSelfComm(), like,
                                             setting=str(blocked / "cache"))
    assert set(costs.seconds) == {"topk", "htopk"} and blocked.read_text() == ""
    assert branch_costs.cache_directory("off") is None
    with pytest.raises(TypeError):
        HierarchyChoice(get_compressor("topk"), get_compressor("htopk"),
                        compression_cost_cache=3)
