"""``dlcomm simulate``: the command line, validation, the campaign's commands, profiling
(torch hooks and dlcomm's timeline) and the seeds' table."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlcomm.cli import main as cli
from dlcomm.tools.simulate import campaign
from dlcomm.tools.simulate.network import CostParams
from dlcomm.tools.simulate.seeds import SEEDS, format_seeds, run_seeds
from dlcomm.tools.simulate.validate import load_runs, validate

REPO = Path(__file__).resolve().parents[2]
PARAMS = CostParams(overhead=5e-4, alpha=1e-4, beta=8.4e-9, gamma=1e-9, alpha_local=2e-5,
                    beta_local=1e-9)


def test_simulate_is_registered() -> None:
    assert cli.SUBCOMMANDS["simulate"] == "dlcomm.tools.simulate.cli"
    help_text = cli.build_parser().format_help()
    assert "simulate" in help_text


def test_importing_the_simulator_loads_no_torch_or_matplotlib() -> None:
    code = ("import sys, dlcomm.tools.simulate, dlcomm.tools.simulate.cli;"
            "print([m for m in ('torch', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_predict_writes_every_method_and_worker_count(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    code = cli.main(["simulate", "predict", "--model", "resnet50", "--device", "rtx2080ti",
                     "--workers", "8,64", "--slots-per-host", "4", "--network", "10gbe",
                     "--method", "dense", "--method", "acpsgd:rank=4", "--method",
                     "dense dear", "--json", str(out), "--markdown", str(tmp_path / "p.md"),
                     "--plot", str(tmp_path / "p.png")])
    assert code == 0
    rows = json.loads(out.read_text())
    assert [(r["method"], r["workers"]) for r in rows] == [
        ("dense", 8), ("acpsgd:rank=4", 8), ("dense dear", 8),
        ("dense", 64), ("acpsgd:rank=4", 64), ("dense dear", 64)]
    assert all(r["iteration_s"] >= r["compute_s"] > 0 for r in rows)
    assert "| acpsgd:rank=4 | 64 | 16x4 |" in capsys.readouterr().out
    assert (tmp_path / "p.png").stat().st_size > 0


def test_predict_with_traces_and_calibrated_params(tmp_path: Path) -> None:
    params = tmp_path / "net.json"
    params.write_text(json.dumps({"params": PARAMS.to_dict()}))
    out = tmp_path / "p.json"
    assert cli.main(["simulate", "predict", "--model", "mnist-mlp", "--device", "cpu-core",
                     "--workers", "4", "--params", str(params), "--method", "dense",
                     "--method", "lbbsp", "--stragglers", "constant:1=0.5",
                     "--iterations", "20", "--json", str(out)]) == 0
    bsp, lb = json.loads(out.read_text())
    assert lb["iteration_s"] < bsp["iteration_s"]
    assert cli.main(["simulate", "predict", "--model", "mnist-mlp", "--workers", "4",
                     "--params", str(params), "--method", "loss_tolerance=0.1",
                     "--congestion", "congest=1:100mbit:1:3,seed=1", "--iterations", "20",
                     "--json", str(out)]) == 0
    assert json.loads(out.read_text())[0]["details"]["lost_fraction"] >= 0


def test_bad_input_is_an_error_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "predict", "--model", "gpt-5"]) == 1
    assert "described models" in capsys.readouterr().err
    assert cli.main(["simulate", "predict", "--method", "none"]) == 1
    assert "schedule=none" in capsys.readouterr().err


def demo_result(ranks: int, compute_ms: list[float], step_s: float, samples: int = 32
                ) -> dict:
    """The fields of examples/torch_mnist.py --json that validation reads."""
    return {"ranks": ranks, "epochs": 3, "epoch_seconds": [step_s * 10] * 3,
            "step_seconds": step_s,
            "phase_ms": [{"before": 0.5, "compute": c, "step": 4.0, "samples": samples}
                         for c in compute_ms]}


def write_run(path: Path, setup: dict, result: dict) -> Path:
    path.write_text(json.dumps({"setup": setup, "command": "...", "result": result}))
    return path


def test_validate_puts_prediction_beside_measurement(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    base = {"model": "mnist-mlp", "batch_size": 32, "heterogeneity": ""}
    files = [
        write_run(tmp_path / "ref.json", {**base, "emulate": "", "slots_per_host": 1,
                                          "method": "dense"}, demo_result(1, [40.0], 0.05)),
        write_run(tmp_path / "a.json", {**base, "emulate": "2x1gbit", "slots_per_host": 1,
                                        "method": "dense"}, demo_result(2, [40, 45], 0.30)),
        write_run(tmp_path / "b.json", {**base, "emulate": "2x1gbit", "slots_per_host": 2,
                                        "method": "acpsgd:rank=4"},
                  demo_result(4, [40, 45, 50, 41], 0.12)),
        write_run(tmp_path / "c.json", {**base, "emulate": "4x1gbit", "slots_per_host": 1,
                                        "method": "dssync:group_size=2"},
                  demo_result(4, [40, 45, 50, 41], 0.25)),
        write_run(tmp_path / "d.json", {**base, "emulate": "2x1gbit", "slots_per_host": 1,
                                        "method": "lbbsp",
                                        "heterogeneity": "compute=1:0.5,seed=1"},
                  demo_result(2, [40, 60], 0.4)),
        write_run(tmp_path / "e.json", {**base, "emulate": "2x1gbit", "slots_per_host": 1,
                                        "method": "loss_tolerance=0.1",
                                        "heterogeneity": "congest=1:100mbit:1:3,seed=1"},
                  demo_result(2, [40, 45], 0.5)),
    ]
    rows = validate(load_runs(files), PARAMS)
    assert len(rows) == 5  # the one-rank reference only gives the update time
    for r in rows:
        assert r["predicted_s"] > r["compute_s"] > 0
        assert r["relative_error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
    params = tmp_path / "net.json"
    params.write_text(json.dumps({"params": PARAMS.to_dict()}))
    md = tmp_path / "v.md"
    assert cli.main(["simulate", "validate", *map(str, files), "--params", str(params),
                     "--markdown", str(md), "--plot", str(tmp_path / "v.png")]) == 0
    assert "within 15% of the measurement" in md.read_text()
    assert "| 2x1gbit | 2 | mnist-mlp | acpsgd:rank=4 |" in capsys.readouterr().out


def test_validate_refuses_runs_without_phase_times(tmp_path: Path) -> None:
    result = demo_result(2, [40, 45], 0.3)
    del result["phase_ms"]
    path = write_run(tmp_path / "a.json", {"model": "mnist-mlp", "emulate": "2x1gbit",
                                           "method": "dense"}, result)
    with pytest.raises(ValueError, match="--phase-times"):
        validate(load_runs([path]), PARAMS)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="campaign run file"):
        load_runs([tmp_path / "bad.json"])


def test_calibrate_command(tmp_path: Path) -> None:
    from dlcomm.tools.simulate.calibrate import Measurement
    from dlcomm.tools.simulate.network import Topology

    files = []
    for hosts in (2, 4, 8):
        for kind in ("allreduce", "allgather", "reducescatter"):
            rows = []
            for n in (4096, 1 << 20, 1 << 24):
                m = Measurement(kind, n, Topology(hosts), 1.0)
                rows.append({"bytes": n, "dlcomm": {"median_s": m.cost().seconds(PARAMS)}})
            path = tmp_path / f"{kind}_{hosts}.json"
            path.write_text(json.dumps({"benchmark": kind, "ranks": hosts,
                                        "emulate": f"{hosts}x1gbit", "rows": rows}))
            files.append(str(path))
    out = tmp_path / "net.json"
    assert cli.main(["simulate", "calibrate", *files, "-o", str(out)]) == 0
    fitted = json.loads(out.read_text())["params"]
    for name in ("overhead", "alpha", "beta", "gamma"):
        assert fitted[name] == pytest.approx(getattr(PARAMS, name), rel=1e-6)
    assert cli.main(["simulate", "calibrate", "-o", str(out)]) == 1


def test_compressor_calibration_runs_the_throughput_benchmark(tmp_path: Path) -> None:
    out = tmp_path / "costs.json"
    assert cli.main(["simulate", "calibrate", "--compressors", "-o", str(out), "--sizes",
                     "1024,4096", "--specs", "topk:ratio=0.01", "--repeats", "1"]) == 0
    costs = json.loads(out.read_text())["compressors"]
    assert set(costs) == {"topk:ratio=0.01"}
    assert costs["topk:ratio=0.01"]["per_element_s"] >= 0
    # a ','-separated list as bench train takes it: a spec's own parameters stay with it
    assert cli.main(["simulate", "calibrate", "--compressors", "-o", str(out), "--sizes",
                     "1024", "--specs", "fp16,topk:ratio=0.01,approx=1", "--repeats",
                     "1"]) == 0
    assert set(json.loads(out.read_text())["compressors"]) == {"fp16",
                                                               "topk:ratio=0.01,approx=1"}


def test_measure_dry_run_lists_the_campaign(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "measure", "calibration", "--out", str(tmp_path),
                     "--dry-run"]) == 0
    text = capsys.readouterr().out
    for spec in ("--emulate 2x1gbit", "--emulate 4x1gbit", "--emulate 8x1gbit",
                 "--slots-per-host 2", "-np 4", "DLCOMM_ALLREDUCE_ALGORITHM=hierarchical",
                 "bench allgather", "bench reducescatter"):
        assert spec in text, spec
    assert not list(tmp_path.iterdir())  # nothing ran
    jobs = campaign.validation_jobs(tmp_path)
    methods = {j.setup["method"] for j in jobs}
    assert {"dense", "dense dear".replace("dear", "schedule=dear"), "acpsgd:rank=4",
            "gtopk:ratio=0.01", "dssync:group_size=2", "lbbsp", "loss_tolerance=0.1"} <= methods
    places = {(j.setup["emulate"], j.setup["slots_per_host"]) for j in jobs}
    assert {("2x1gbit", 1), ("4x1gbit", 1), ("8x1gbit", 1), ("2x1gbit", 2), ("", 1)} == places
    assert all("--phase-times" in j.command for j in jobs)
    quick = campaign.validation_jobs(tmp_path, quick=True)
    assert len(quick) < 5


def test_every_job_sets_its_all_reduce_algorithm_and_records_it(tmp_path: Path) -> None:
    for quick in (False, True):
        jobs = campaign.calibration_jobs(tmp_path, quick=quick) + campaign.validation_jobs(
            tmp_path, quick=quick)
        assert len({j.name for j in jobs}) == len(jobs)  # --only can tell them apart
        for job in jobs:
            env = dict(job.env)
            assert env["DLCOMM_ALLREDUCE_ALGORITHM"] == job.setup["allreduce_algorithm"], job
            assert "DLCOMM_ALLREDUCE_ALGORITHM=" in job.shell()
    validation = campaign.validation_jobs(tmp_path)
    by_method = {(j.setup["method"], j.setup["emulate"], j.setup["slots_per_host"]):
                 j.setup["allreduce_algorithm"] for j in validation}
    for (method, _, _), algorithm in by_method.items():
        named = [a for a in ("ring", "rhd", "tree", "hierarchical") if a in method.split()]
        assert algorithm == (named[0] if named else "auto"), method  # the engine default
    assert by_method[("dense ring", "4x1gbit", 1)] == "ring"


def test_calibration_measures_ordered_beside_the_other_algorithms(tmp_path: Path) -> None:
    jobs = campaign.calibration_jobs(tmp_path)
    runs: dict[tuple[str, str], set] = {}
    for job in jobs:
        bench = job.command[job.command.index("bench") + 1]
        sizes = job.command[job.command.index("--sizes") + 1]
        where = (job.setup["emulate"], job.setup["slots_per_host"],
                 job.command[job.command.index("-np") + 1] if "-np" in job.command else "")
        runs.setdefault((bench, job.setup["allreduce_algorithm"]), set()).add((where, sizes))
    places = runs[("allreduce", "ring")]
    assert len(places) == 6  # shared memory 2 and 4, 2/4/8 hosts, 2 hosts x 2
    for algorithm in ("ordered", "ordered_tcp", "rhd", "tree"):
        assert runs[("allreduce", algorithm)] == places, algorithm
    assert runs[("allreduce", "hierarchical")] < places
    # the engine's reduce-scatter under ordered and ordered_tcp, MPI's own under mpi; the
    # all-gather; never auto, which picks by size and fits no one formula
    assert runs[("reducescatter", "ordered")] == runs[("reducescatter", "mpi")] == places
    assert runs[("reducescatter", "ordered_tcp")] == places
    assert runs[("allgather", "ordered")] == places
    assert {a for b, a in runs if b == "allreduce"} == {"ordered", "ordered_tcp", "ring", "rhd",
                                                       "tree", "hierarchical"}
    assert not any(a == "auto" for _, a in runs)


def test_measure_only_runs_the_jobs_whose_name_matches(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    every = campaign.validation_jobs(tmp_path)
    assert cli.main(["simulate", "measure", "validation", "--out", str(tmp_path),
                     "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"{len(every)} jobs (dry run: nothing ran)" in text
    assert text.count("DLCOMM_ALLREDUCE_ALGORITHM=") == len(every)
    assert cli.main(["simulate", "measure", "validation", "--out", str(tmp_path),
                     "--dry-run", "--only", "^reference_|^4x1gbitx1_mlp_dense"]) == 0
    text = capsys.readouterr().out
    chosen = [j.name for j in every if j.name.startswith(
        ("reference_", "4x1gbitx1_mlp_dense"))]
    assert 4 < len(chosen) < len(every)
    assert f"{len(chosen)} of the {len(every)} validation jobs" in text
    assert f"{len(chosen)} jobs (dry run: nothing ran)" in text
    listed = [line.split("] ", 1)[1].split(":", 1)[0] for line in text.splitlines()
              if line.startswith("[")]
    assert listed == chosen
    assert campaign.select_jobs(every, None) == every
    assert [j.name for j in campaign.select_jobs(every, "congested$")] == [
        j.name for j in every if j.name.endswith("congested")]
    assert cli.main(["simulate", "measure", "calibration", "--out", str(tmp_path),
                     "--dry-run", "--only", "nothing-like-this"]) == 1
    assert "matches none of the" in capsys.readouterr().err
    assert cli.main(["simulate", "measure", "calibration", "--out", str(tmp_path),
                     "--dry-run", "--only", "(unclosed"]) == 1
    assert "not a regular expression" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing ran


def test_only_runs_the_chosen_jobs_for_real(tmp_path: Path) -> None:
    made = []
    for name in ("alpha_one", "beta_two", "alpha_three"):
        result = tmp_path / f"{name}.json"
        write = f"import json; json.dump({{'ranks': 1}}, open({str(result)!r}, 'w'))"
        made.append(campaign.Job(name, (sys.executable, "-c", write),
                                 (("DLCOMM_ALLREDUCE_ALGORITHM", "ordered"),), result,
                                 {"allreduce_algorithm": "ordered"}))
    assert campaign.run_jobs(campaign.select_jobs(made, "^alpha")) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alpha_one.json", "alpha_three.json"]


def test_validation_predicts_with_the_algorithm_the_run_set(tmp_path: Path) -> None:
    from dlcomm.tools.simulate.validate import method_of

    assert method_of({"method": "dense"}).algorithm == "auto"
    assert method_of({"method": "dense", "allreduce_algorithm": "ordered"}).algorithm == \
        "ordered"
    assert method_of({"method": "dense", "allreduce_algorithm": "ring"}).algorithm == "ring"
    assert method_of({"method": "dense", "allreduce_algorithm": "native"}).algorithm == "mpi"
    assert method_of({"method": "dense rhd", "allreduce_algorithm": "rhd"}).algorithm == "rhd"
    with pytest.raises(ValueError, match="DLCOMM_ALLREDUCE_ALGORITHM=ring"):
        method_of({"method": "dense rhd", "allreduce_algorithm": "ring"}, "x.json")
    # 2 hosts x 2 slots: ordered's all-to-all puts more bytes on a host's link than the ring
    base = {"model": "mnist-mlp", "batch_size": 32, "heterogeneity": "", "method": "dense",
            "emulate": "2x1gbit", "slots_per_host": 2}
    result = demo_result(4, [40, 45, 50, 41], 0.3)
    predicted = {}
    for algorithm in ("ordered", "ring"):
        path = write_run(tmp_path / f"{algorithm}.json",
                         {**base, "allreduce_algorithm": algorithm}, result)
        (row,) = validate(load_runs([path]), PARAMS)
        predicted[algorithm] = row["predicted_s"]
    assert predicted["ordered"] > predicted["ring"]


def test_measured_time_is_the_steady_state_after_the_first_epoch(tmp_path: Path) -> None:
    result = demo_result(2, [40, 45], 0.3)
    # 10 steps per epoch: the first epoch 9 s (start-up), then 3 s each; 15 s / 30 steps
    result.update(epoch_seconds=[9.0, 3.0, 3.0], step_seconds=0.5)
    setup = {"model": "mnist-mlp", "batch_size": 32, "heterogeneity": "", "method": "dense",
             "emulate": "2x1gbit", "slots_per_host": 1}
    (run,) = load_runs([write_run(tmp_path / "a.json", setup, result)])
    assert run.steady_step_seconds == pytest.approx(0.3)
    (row,) = validate([run], PARAMS)
    assert row["measured_s"] == pytest.approx(0.3)
    result.update(epoch_seconds=[4.0], step_seconds=0.4)  # one epoch: all of it
    (run,) = load_runs([write_run(tmp_path / "b.json", setup, result)])
    assert run.steady_step_seconds == pytest.approx(0.4)


def test_cpu_work_measured_alone_is_stretched_where_ranks_outnumber_cores(
        tmp_path: Path) -> None:
    base = {"model": "mnist-mlp", "batch_size": 32, "heterogeneity": "",
            "emulate": "4x1gbit", "slots_per_host": 1}
    ref = write_run(tmp_path / "ref.json", {**base, "emulate": "", "method": "dense"},
                    demo_result(1, [40.0], 0.05))  # its update: 4 ms alone
    result = demo_result(4, [40, 45, 50, 41], 0.3)
    rows = {}
    for cores in (None, 4, 2, 1):
        setup = {**base, "method": "topk:ratio=0.01"}
        if cores is not None:
            setup["machine_cores"] = cores
        path = write_run(tmp_path / f"topk_{cores}.json", setup, result)
        (rows[cores],) = validate(load_runs([ref, path]), PARAMS)
    assert [rows[c]["cpu_share"] for c in (None, 4, 2, 1)] == [1.0, 1.0, 2.0, 4.0]
    assert rows[None]["predicted_s"] == rows[4]["predicted_s"]
    assert rows[4]["predicted_s"] < rows[2]["predicted_s"] < rows[1]["predicted_s"]
    # the option fills in files that do not record the machine; a file's own value wins
    runs = load_runs([ref, tmp_path / "topk_None.json", tmp_path / "topk_4.json"])
    by_source = {r["source"]: r for r in validate(runs, PARAMS, machine_cores=2)}
    assert by_source[str(tmp_path / "topk_None.json")]["cpu_share"] == 2.0
    assert by_source[str(tmp_path / "topk_4.json")]["cpu_share"] == 1.0
    bad = write_run(tmp_path / "bad.json", {**base, "method": "dense", "machine_cores": 0},
                    result)
    with pytest.raises(ValueError, match="machine_cores must be an int >= 1"):
        validate(load_runs([bad]), PARAMS)


def test_busy_calls_cost_more_only_where_ranks_outnumber_cores(tmp_path: Path) -> None:
    from dlcomm.tools.simulate.validate import busy_call_from_roundtrip

    rounds = [{"idle": {"p50_ms": 0.2}, "busy": {"p50_ms": b}} for b in (16.2, 8.2, 12.2)]
    busy = busy_call_from_roundtrip(rounds)
    assert busy == pytest.approx(0.012)  # the median of busy - idle
    for bad in ([], [{"idle": {}}], [3]):
        with pytest.raises(ValueError, match="roundtrip"):
            busy_call_from_roundtrip(bad)
    base = {"model": "mnist-mlp", "batch_size": 32, "heterogeneity": "",
            "emulate": "4x1gbit", "slots_per_host": 1}
    result = demo_result(4, [40, 45, 50, 41], 0.3)
    rows = {}
    for method in ("dense", "topk:ratio=0.01"):
        for cores in (4, 2):
            path = write_run(tmp_path / f"{method.split(':')[0]}_{cores}.json",
                             {**base, "method": method, "machine_cores": cores}, result)
            rows[method, cores] = [
                validate(load_runs([path]), PARAMS, busy_call_s=b)[0]["predicted_s"]
                for b in (0.0, busy)]
    for method in ("dense", "topk:ratio=0.01"):  # a core per rank: no busy waits
        assert rows[method, 4][0] == rows[method, 4][1]
    # ranks sharing cores: the compressing method's calls wait, the dense ones do not
    assert rows["topk:ratio=0.01", 2][1] > rows["topk:ratio=0.01", 2][0]
    assert rows["dense", 2][1] == rows["dense", 2][0]
    rows[2] = rows["topk:ratio=0.01", 2]
    roundtrip = tmp_path / "rt.json"
    roundtrip.write_text(json.dumps(rounds))
    out, params = tmp_path / "rows.json", tmp_path / "net.json"
    params.write_text(json.dumps({"params": PARAMS.to_dict()}))
    assert cli.main(["simulate", "validate", str(tmp_path / "topk_2.json"), "--params",
                     str(params), "--roundtrip", str(roundtrip), "--json", str(out)]) == 0
    assert json.loads(out.read_text())[0]["predicted_s"] == pytest.approx(rows[2][1])


def test_validation_jobs_record_the_machine_cores(tmp_path: Path) -> None:
    from dlcomm.comm.machine import local_core_count

    jobs = campaign.validation_jobs(tmp_path, quick=True)
    assert {j.setup["machine_cores"] for j in jobs} == {local_core_count()}


def test_run_jobs_wraps_each_result_with_its_setup(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    write = f"import json; json.dump([{{'ranks': 1}}], open({str(result)!r}, 'w'))"
    job = campaign.Job("fake", (sys.executable, "-c", write), (("DLCOMM_X", "1"),), result,
                       {"emulate": "", "model": "m"})
    assert campaign.run_jobs([job]) == 0
    wrapped = json.loads(result.read_text())
    assert wrapped["setup"] == {"emulate": "", "model": "m"}
    assert wrapped["result"] == {"ranks": 1} and "DLCOMM_X=1" in wrapped["command"]
    failing = campaign.Job("bad", (sys.executable, "-c", "raise SystemExit(3)"), (),
                           tmp_path / "none.json", {})
    assert campaign.run_jobs([failing, job], keep_going=True) == 1


def test_seeds_table_and_figures(tmp_path: Path) -> None:
    assert cli.main(["simulate", "seeds", "--only", "lbbsp,dssync", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "seeds.md").read_text()
    assert "LB-BSP" in text and "DS-Sync" in text and "![" in text
    assert (tmp_path / "seed_lbbsp.png").stat().st_size > 0
    data = json.loads((tmp_path / "seeds.json").read_text())
    assert [d["key"] for d in data] == ["lbbsp", "dssync"]
    with pytest.raises(ValueError, match="available"):
        run_seeds(["nothing"])


def test_every_seed_runs_is_deterministic_and_the_docs_are_current() -> None:
    first = run_seeds()
    assert [r.key for r in first] == list(SEEDS)
    for r in first:
        assert r.rows and r.paper_value > 1 and r.simulated_value > 0
    # docs/simulation/seeds.md is `dlcomm simulate seeds --out docs/simulation`'s output, and
    # docs/simulation.md quotes its summary table: regenerate both when this fails
    full = format_seeds(first, {r.key: f"seed_{r.key}.png" for r in first})
    assert (REPO / "docs" / "simulation" / "seeds.md").read_text() == full
    page = (REPO / "docs" / "simulation.md").read_text()
    for line in full.split("\n\n")[0].splitlines():
        assert line in page, line
    again = run_seeds(["gtopk", "lbbsp", "dlcp"])
    assert format_seeds(again) == format_seeds([r for r in first if r.key in
                                                ("gtopk", "lbbsp", "dlcp")])


def test_profile_a_torch_model(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from dlcomm.tools.simulate.profile_torch import profile_model

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 10))
    w = profile_model(model, lambda: (torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))),
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1), repeats=2,
                      name="tiny")
    assert [t.name for t in w.tensors] == [n for n, _ in model.named_parameters()]
    assert w.batch_size == 8 and w.forward_s > 0 and w.backward_s > 0 and w.update_s > 0
    assert all(layer.forward_s >= 0 and layer.backward_s >= 0 for layer in w.layers)
    out = tmp_path / "mlp.json"
    assert cli.main(["simulate", "profile", "--factory", str(REPO / "examples" /
                                                              "torch_mnist.py") + ":MLP",
                     "--factory-args", "[28]", "--input-shape", "1,28,28", "--batch-size",
                     "4", "--warmup", "0", "--repeats", "1", "-o", str(out)]) == 0
    from dlcomm.tools.simulate.model_zoo import describe
    from dlcomm.tools.simulate.workload import Workload

    profiled = Workload.load(out)
    assert [(t.name, t.shape) for t in profiled.tensors] == [
        (t.name, t.shape) for layer in describe("mnist-mlp").layers for t in layer.tensors]


def test_compute_from_dlcomm_timeline(tmp_path: Path) -> None:
    from dlcomm.tools.simulate.devices import get_device
    from dlcomm.tools.simulate.model_zoo import describe, workload_from_description
    from dlcomm.tools.simulate.timeline_profile import timeline_compute, workload_from_timeline

    rows = {"(training)": 1, "wfbp0.fc3.weight": 2, "wfbp0.fc3.bias": 3,
            "wfbp0.fc2.weight": 4, "wfbp0.fc2.bias": 5, "wfbp0.fc1.weight": 6,
            "wfbp0.fc1.bias": 7}
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}}
              for name, tid in rows.items()]
    for it in range(3):  # forward 10 ms, backward 30 ms, step 5 ms (microseconds)
        t0 = it * 100_000.0
        events += [{"name": "forward", "ph": "X", "pid": 0, "tid": 1, "ts": t0, "dur": 10_000},
                   {"name": "backward", "ph": "X", "pid": 0, "tid": 1, "ts": t0 + 10_000,
                    "dur": 30_000},
                   {"name": "step", "ph": "X", "pid": 0, "tid": 1, "ts": t0 + 40_000,
                    "dur": 5_000}]
        for name, at in (("fc3", 2_000), ("fc2", 12_000), ("fc1", 29_000)):
            for suffix in ("weight", "bias"):
                events.append({"name": "queued", "ph": "X", "pid": 0,
                               "tid": rows[f"wfbp0.{name}.{suffix}"], "ts": t0 + 10_000 + at,
                               "dur": 100})
    path = tmp_path / "tl.json"
    path.write_text(json.dumps(events))
    measured = timeline_compute(path)
    assert (measured.forward_s, measured.backward_s, measured.step_s) == pytest.approx(
        (0.010, 0.030, 0.005))
    assert measured.ready_s["fc2.weight"] == pytest.approx(0.012)
    base = workload_from_description(describe("mnist-mlp"), 32, get_device("cpu-core"))
    w = workload_from_timeline(base, measured)
    assert w.forward_s == pytest.approx(0.010) and w.backward_s == pytest.approx(0.030)
    assert [layer.backward_s for layer in w.layers] == pytest.approx([0.018, 0.010, 0.002])
    with pytest.raises(ValueError, match="timeline_range"):
        timeline_compute(path, rank=3)
