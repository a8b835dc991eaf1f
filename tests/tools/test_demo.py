"""The torch demo (`examples/torch_mnist.py`, what `make demo` runs) on 2 real ranks, once
per feature it can switch on: it must learn the digits and end with one model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import REPO, run_mpi

pytest.importorskip("torch")
pytest.importorskip("sklearn")



@pytest.mark.parametrize("extra", [
    [],
    ["--schedule", "dear"],
    ["--schedule", "none", "--model", "mlp"],
    ["--compression", "fp16", "--width", "8"],
    ["--sync", "lbbsp", "--phase-times"],
    ["--loss-tolerance", "0.05"],
    ["--sync", "dssync:group_size=2"],  # on 4 ranks: on 2 it would be BSP
], ids=lambda extra: " ".join(extra) or "default")
def test_demo_learns_with_each_feature(tmp_path: Path, extra: list[str]) -> None:
    script = (REPO / "examples" / "torch_mnist.py").read_text()
    out = tmp_path / "result.json"
    ranks = 4 if "dssync:group_size=2" in extra else 2
    lr = "0.05" if ranks == 2 else "0.02"  # lr x ranks: 0.05 x 4 diverges, with BSP too
    proc = run_mpi(ranks, script, tmp_path, timeout=300,
                   args=["--dataset", "digits", "--epochs", "3", "--lr", lr,
                         "--no-progress", "--json", str(out), *extra])
    summary = proc.rank_stdout[0]  # rank 0 prints the summary
    assert f"parameters identical on all {ranks} ranks: yes" in summary, proc.report()
    result = json.loads(out.read_text())
    assert len(result["epoch_accuracy"]) == len(result["epoch_seconds"]) == 3
    assert result["width"] == (8 if "--width" in extra else 16)
    assert result["steal_s"] is None or result["steal_s"] >= 0
    assert result["accuracy"] > 0.6, proc.report()  # chance is 0.1; dense reaches ~0.82
    if "--phase-times" in extra:  # one median per rank and phase
        phases = result["phase_ms"]
        assert [sorted(p) for p in phases] == [sorted(
            ["before", "before.cpu", "compute", "compute.cpu", "step", "step.cpu", "samples"])] * 2
        assert all(p["compute"] > 0 and p["compute.cpu"] > 0 for p in phases)
        assert "rank 1: median step of" in summary, proc.report()
