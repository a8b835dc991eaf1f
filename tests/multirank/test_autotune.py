"""Autotuning of fusion_threshold/cycle_time: the Bayesian search converges on a synthetic
cost, the tuner's sample/agree/apply cycle, settings reach the engine, and a 2-rank run
where every rank ends with the same tuned settings as rank 0's log."""
import dataclasses
import json
import re
import types

import pytest
from mpi_run import run_mpi

from dlcomm.autotune import Autotuner, apply_settings, current_settings
from dlcomm.config import load_config

optuna = pytest.importorskip("optuna")

MIB = 1 << 20


def synthetic_cost(fusion: int, cycle: float) -> float:
    """A bowl with its minimum 0.1 s at 40 MiB and 5 ms."""
    return 0.1 + ((fusion / MIB - 40) / 64) ** 2 + ((cycle - 5) / 20) ** 2


def test_bayesian_search_converges_on_a_synthetic_cost():
    from dlcomm.autotune.search import BayesianSearch

    search = BayesianSearch(initial=(64 * MIB, 1.0), seed=0)
    first = search.ask()
    assert first == (64 * MIB, 1.0)  # the job's own settings are measured first
    search.tell(synthetic_cost(*first))
    for _ in range(15):
        search.tell(synthetic_cost(*search.ask()))
    (fusion, cycle), cost = search.best()
    assert cost == pytest.approx(synthetic_cost(fusion, cycle))
    assert cost < 0.1 + 0.02, (fusion / MIB, cycle, cost)  # within 2% of the bowl's depth
    assert cost < synthetic_cost(64 * MIB, 1.0)


def test_search_validates_arguments_and_call_order():
    from dlcomm.autotune.search import BayesianSearch

    with pytest.raises(ValueError, match="fusion_mib"):
        BayesianSearch(fusion_mib=(5, 1))
    search = BayesianSearch(seed=1)
    with pytest.raises(RuntimeError, match="ask"):
        search.tell(1.0)
    search.ask()
    with pytest.raises(RuntimeError, match="tell"):
        search.ask()
    with pytest.raises(ValueError, match="finite"):
        search.tell(float("nan"))


def test_autotuner_samples_applies_and_keeps_the_best(tmp_path):
    applied = []
    state = {"settings": (64 * MIB, 1.0)}

    def apply(fusion, cycle):
        applied.append((fusion, cycle))
        state["settings"] = (fusion, cycle)

    log = tmp_path / "autotune.jsonl"
    tuner = Autotuner(apply, state["settings"], warmup_steps=2, steps_per_sample=3,
                      max_samples=12, log_path=str(log), mean_over_ranks=lambda x: x,
                      broadcast=lambda obj: obj)
    steps = 0
    while not tuner.done:
        tuner.step_finished(elapsed=synthetic_cost(*state["settings"]))
        steps += 1
        assert steps < 200
    assert steps == 2 + 1 + 12 * 3  # warm-up, the start of sampling, 12 samples of 3 steps
    assert len(tuner.samples) == 12
    for settings, cost in tuner.samples:
        assert cost == pytest.approx(synthetic_cost(*settings))
    best = min(tuner.samples, key=lambda s: s[1])
    assert state["settings"] == best[0] == tuner.current
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 13 and records[-1]["final"] is True
    assert records[-1]["fusion_threshold"] == best[0][0]
    tuner.step_finished(elapsed=1.0)  # after the search: nothing changes any more
    assert state["settings"] == best[0]
    with pytest.raises(ValueError, match="steps_per_sample"):
        Autotuner(apply, (0, 1.0), steps_per_sample=0)


def test_apply_settings_changes_what_the_engine_reads():
    engine = types.SimpleNamespace(config=load_config(env={}),
                                   executor=types.SimpleNamespace(fusion_threshold=64 * MIB))

    def set_tunables(threshold, cycle):  # the real one is a negotiated request
        engine.config = dataclasses.replace(engine.config, fusion_threshold=threshold,
                                            cycle_time=cycle)
        engine.executor.fusion_threshold = threshold

    engine.set_tunables = set_tunables
    apply_settings(engine, 8 * MIB, 2.5)
    assert current_settings(engine) == (8 * MIB, 2.5)
    assert engine.config.fusion_threshold == 8 * MIB
    with pytest.raises(ValueError, match="fusion_threshold"):
        apply_settings(engine, -1, 1.0)
    with pytest.raises(ValueError, match="cycle_time"):
        apply_settings(engine, 1, float("nan"))


AUTOTUNE_SCRIPT = r'''
import json, sys
import torch
import dlcomm.torch as hvd
from dlcomm.autotune import current_settings
from dlcomm.basics import state

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters(), schedule=sys.argv[1])
x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
for _ in range(1 + 1 + 5 * 2 + 2):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
if hasattr(opt, "flush"):
    opt.flush()
mine = current_settings(state().engine)
everyone = hvd.allgather_object(mine)
assert all(s == everyone[0] for s in everyone), everyone
if hvd.rank() == 0:
    print("SETTINGS " + json.dumps(list(mine)), flush=True)  # one write
'''


@pytest.mark.parametrize("schedule", ["dear"])
def test_two_ranks_agree_on_tuned_settings(tmp_path, schedule):
    log = tmp_path / "tune.jsonl"
    proc = run_mpi(2, AUTOTUNE_SCRIPT, tmp_path, timeout=150, args=[schedule], env={
        "DLCOMM_AUTOTUNE": "1", "DLCOMM_AUTOTUNE_LOG": str(log),
        "DLCOMM_AUTOTUNE_WARMUP_STEPS": "1", "DLCOMM_AUTOTUNE_STEPS_PER_SAMPLE": "2",
        "DLCOMM_AUTOTUNE_MAX_SAMPLES": "5"})
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r.get("sample") for r in records[:5]] == [1, 2, 3, 4, 5]
    final = records[5]
    assert final["final"] is True
    best = min(records[:5], key=lambda r: r["seconds_per_step"])
    assert final["fusion_threshold"] == best["fusion_threshold"]
    (payload,) = re.findall(r"SETTINGS (\[[^\]]*\])", proc.rank_stdout[0])
    assert json.loads(payload) == [final["fusion_threshold"], final["cycle_time_ms"]]
