"""``dlcomm bench kfac``: its commands, its summary, and a tiny real run of the dlcomm job
(and of the kfac-pytorch job where kfac-pytorch can be imported: KFAC_PYTORCH_PATH names
the directory it was installed to with pip install --target)."""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from dlcomm.cli import main as cli
from dlcomm.tools.bench import kfac as bench

pytest.importorskip("torch")
pytest.importorskip("mlxtend")


def options() -> dict:
    return {flag.lstrip("-").replace("-", "_"): default
            for flag, _, default, _ in bench.JOB_OPTIONS}


def test_job_commands_pass_every_setting_and_the_peer_its_rendezvous(tmp_path: Path) -> None:
    ours = bench.job_command("dlcomm", 4, None, options(), tmp_path / "a.json", "/peer", None,
                             29999)
    assert ours[:3] == ["dlcommrun", "-np", "4"] and "--emulate" not in ours
    assert "--peer-path" not in ours and "--master-port" not in ours
    for flag, _, default, _ in bench.JOB_OPTIONS:
        assert ours[ours.index(flag) + 1] == str(default)
    peer = bench.job_command("kfac-pytorch", 4, "4x1gbit", options(), tmp_path / "b.json",
                             "/peer", 1, 29999)
    assert peer[3:5] == ["--emulate", "4x1gbit"]
    assert peer[peer.index("--peer-path") + 1] == "/peer"
    assert peer[peer.index("--master-port") + 1] == "29999"
    assert peer[peer.index("--symmetry-aware") + 1] == "1"
    assert 20000 <= bench.free_port() <= 45000


def test_summary_takes_medians_over_rounds_and_the_ratio() -> None:
    def run(times: list[float], acc: list[float]) -> dict:
        return {"iteration_s": times, "epochs": [{"accuracy": a, "train_s": 1.0} for a in acc]}

    results = {"kfac-pytorch": [run([0.3, 0.3], [0.5, 0.8]), run([0.5, 0.5], [0.5, 0.8]),
                                run([0.4, 0.6], [0.5, 0.8])],
               "dlcomm": [run([0.2, 0.2], [0.5, 0.81]), run([0.25, 0.25], [0.5, 0.81]),
                          run([0.1, 0.5], [0.5, 0.81])]}
    summary = bench.summarize(results)
    assert summary["kfac-pytorch"]["iteration_mean_s"] == pytest.approx(0.5)
    assert summary["dlcomm"]["iteration_mean_s"] == pytest.approx(0.25)
    assert summary["dlcomm"]["accuracy"] == pytest.approx([0.5, 0.81])
    text = bench.format_summary(summary, 4, "4x1gbit")
    assert "emulated 4x1gbit" in text and "2.00x" in text and "1.00 points" in text


def test_cli_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "kfac", "--frameworks", "horovod"]) == 1
    assert "--frameworks" in capsys.readouterr().err
    assert cli.main(["bench", "kfac", "--np", "0"]) == 1
    assert cli.main(["bench", "kfac", "--compute-method", "lu"]) == 1


def test_a_tiny_run_trains_and_reports_accuracy_per_epoch(tmp_path: Path) -> None:
    peer_path = os.environ.get("KFAC_PYTORCH_PATH")
    frameworks = "dlcomm"
    if peer_path or importlib.util.find_spec("kfac") is not None:
        frameworks = "kfac-pytorch,dlcomm"
    argv = ["bench", "kfac", "--np", "2", "--frameworks", frameworks, "--epochs", "2",
            "--max-steps", "2", "--warmup", "0", "--inv-update-steps", "2",
            "--json", str(tmp_path / "kfac.json"), "--timeout", "600"]
    if peer_path:
        argv += ["--peer-path", peer_path]
    assert cli.main(argv) == 0
    result = json.loads((tmp_path / "kfac.json").read_text())
    for framework in frameworks.split(","):
        (run,) = result["rounds"][framework]
        assert run["ranks"] == 2 and len(run["iteration_s"]) == 4
        assert [e["epoch"] for e in run["epochs"]] == [1, 2]
        assert all(0.0 <= e["accuracy"] <= 1.0 for e in run["epochs"])
        assert all(e["cpu_s"] > 0 for e in run["epochs"])  # rank 0's CPU time per epoch
        assert result["summary"][framework]["cpu_per_iteration_s"] > 0
    if "kfac-pytorch" in result["rounds"]:  # the same training, to rounding
        ours = [e["accuracy"] for e in result["rounds"]["dlcomm"][0]["epochs"]]
        peer = [e["accuracy"] for e in result["rounds"]["kfac-pytorch"][0]["epochs"]]
        assert ours == pytest.approx(peer, abs=0.01)
