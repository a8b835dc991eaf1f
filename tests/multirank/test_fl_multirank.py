"""dlcomm.fl on real MPI ranks: a simulation on 1, 2, 3 and 4 ranks (clients per round not a
multiple of the ranks, and fewer than the ranks) ends at the single-process reference's
weights, with client state spilled and handed between ranks; a deployment (one rank per
client) equals the simulation; ranks that disagree on the sample fail on every rank."""
from __future__ import annotations

import json
import sys

import pytest
from mpi_run import run_mpi

STRATEGIES = ["fedavg", "fedprox:mu=0.1", "fedopt:optimizer=adam,eta=0.05", "fednova",
              "scaffold:client_lr=0.05"]

SIMULATE = r"""
import json, sys
import numpy as np
import dlcomm
from dlcomm import fl
from fl_toy import client_sizes, initial_weights, make_update

out, per_round, mode, CLIENTS = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
ROUNDS = 3
dlcomm.init()
results = {}
for spec in STRATEGIES:
    ref, hist = fl.run_reference(make_update(keep_state=True), initial_weights(), CLIENTS,
                                 per_round, ROUNDS, spec, seed=4, metric_names=["loss"])
    kind = fl.Simulation if mode == "simulate" else fl.Deployment
    run = kind(make_update(keep_state=True), initial_weights(), CLIENTS, per_round, spec,
               client_sizes=client_sizes(CLIENTS), seed=4, metric_names=["loss"],
               fl_state_memory_budget=0)
    reports = run.run(ROUNDS)
    memory = run.memory_summary()
    final = run.weights
    everyone = dlcomm.allgather_object({k: v.tobytes() for k, v in final.items()})
    run.close()
    results[spec] = {
        "max_diff": max(float(np.abs(final[k] - ref[k]).max()) for k in ref),
        "identical_on_all_ranks": all(e == everyone[0] for e in everyone),
        "clients": [r.clients.tolist() for r in reports],
        "ref_clients": [h["clients"] for h in hist],
        "loss": [r.metrics["loss"] for r in reports],
        "ref_loss": [h["metrics"]["loss"] for h in hist],
        "spills": sum(memory["state_spills"]),
        "state_peak_bytes": memory["state_peak_bytes"],
        "ranks": dlcomm.size(),
        "state_dir_parent": str(run.store.directory.parent),
    }
if dlcomm.rank() == 0:
    with open(out, "w") as f:
        json.dump(results, f)
""".replace("STRATEGIES:", repr(STRATEGIES) + ":")


def check(results: dict, np_: int) -> None:
    assert set(results) == set(STRATEGIES)
    for spec, r in results.items():
        assert r["ranks"] == np_
        assert r["identical_on_all_ranks"], spec
        assert r["max_diff"] <= 1e-6, (spec, r["max_diff"])
        assert r["clients"] == r["ref_clients"], spec
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-9), spec
    # the toy keeps a visit counter per client, so every strategy has state; with a zero
    # memory budget every state goes through a file
    assert all(r["spills"] > 0 for r in results.values())
    assert all(max(r["state_peak_bytes"]) == 0 for r in results.values())


@pytest.mark.parametrize("np_, per_round", [(1, 5), (2, 5), (3, 7), (4, 3)])
def test_simulation_equals_the_single_process_reference(tmp_path, np_, per_round) -> None:
    out = tmp_path / "results.json"
    state = tmp_path / "state"  # DLCOMM_FL_STATE_DIR: each run makes and removes its own dir
    state.mkdir()
    run_mpi(np_, SIMULATE, tmp_path, timeout=120, env={"DLCOMM_FL_STATE_DIR": str(state)},
            args=[str(out), str(per_round), "simulate", "11"])
    results = json.loads(out.read_text())
    check(results, np_)
    assert {r["state_dir_parent"] for r in results.values()} == {str(state)}
    assert list(state.iterdir()) == []


def test_deployment_equals_simulation_and_reference(tmp_path) -> None:
    # 4 clients + the server: 5 ranks, 3 clients per round; then the same run simulated on 2
    out = tmp_path / "deploy.json"
    run_mpi(5, SIMULATE, tmp_path, timeout=120, args=[str(out), "3", "deploy", "4"])
    deploy = json.loads(out.read_text())
    check(deploy, 5)
    out = tmp_path / "simulate.json"
    run_mpi(2, SIMULATE, tmp_path, timeout=120, args=[str(out), "3", "simulate", "4"])
    simulate = json.loads(out.read_text())
    check(simulate, 2)
    for spec in STRATEGIES:
        assert deploy[spec]["loss"] == pytest.approx(simulate[spec]["loss"], rel=1e-9)


MISMATCH = r"""
import sys
import dlcomm
from dlcomm import fl
from fl_toy import initial_weights, make_update

dlcomm.init()
sim = fl.Simulation(make_update(), initial_weights(), 10, 4, seed=dlcomm.rank(),
                    metric_names=["loss"])
try:
    sim.run(1)
    message = "no error"
except RuntimeError as exc:
    message = str(exc)
finally:
    sim.close()
try:
    fl.Deployment(make_update(), initial_weights(), 3, 2)
    message += "\nno error"
except ValueError as exc:
    message += "\n" + str(exc)
with open(sys.argv[1] + f"/rank{dlcomm.rank()}.txt", "w") as f:
    f.write(message)
"""


def test_ranks_that_disagree_or_miscount_fail_on_every_rank(tmp_path) -> None:
    run_mpi(2, MISMATCH, tmp_path, timeout=60, args=[str(tmp_path)])
    for r in range(2):
        text = (tmp_path / f"rank{r}.txt").read_text()
        assert "ranks [1] sampled or scheduled other clients" in text, text
        assert "4 ranks for 3 clients, this job has 2" in text, text


EXAMPLE = r"""
import runpy, sys
runpy.run_path(sys.argv.pop(1), run_name="__main__")
"""


def test_torch_example_matches_its_reference_on_two_ranks(tmp_path) -> None:
    pytest.importorskip("torch")
    from mpi_run import REPO

    out = tmp_path / "example.json"
    run_mpi(2, EXAMPLE, tmp_path, timeout=180,
            args=[str(REPO / "examples" / "fl_train.py"), "--dataset", "digits",
                  "--clients", "12", "--clients-per-round", "5", "--rounds", "2",
                  "--strategy", "scaffold", "--trace", "--check-reference",
                  "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["ranks"] == 2 and result["strategy"].startswith("scaffold")
    assert result["max_abs_diff_to_reference"] <= 1e-5
    assert 0.0 <= result["accuracy"] <= 1.0 and len(result["round_seconds"]) == 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
