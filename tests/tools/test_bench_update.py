"""``dlcomm bench update``: it runs each implementation, its rows are consistent, and bad
names are refused by the parser."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlcomm.cli.main", "bench", "update", *args],
                          capture_output=True, text=True, timeout=300)


def test_update_benchmark_times_every_implementation(tmp_path):
    out = tmp_path / "update.json"
    proc = run("--models", "deep", "--optimizers", "sgd,adam", "--rounds", "2", "--steps", "1",
               "--warmup", "0", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["optimizer"]) for r in rows] == [("deep", "sgd"), ("deep", "adam")]
    for row in rows:
        assert row["tensors"] == 192 and row["parameters"] == 48 * (256 * 256 + 256 + 512)
        assert set(row["seconds_per_step"]) == {"per-tensor", "foreach", "fused"}
        assert all(len(t) == 2 for t in row["all_seconds"].values())
        assert row["speedup_over_per_tensor"]["per-tensor"] == 1.0
    assert "| deep | 192 | sgd |" in proc.stdout


def test_unknown_model_is_refused():
    proc = run("--models", "mlp,resnet")
    assert proc.returncode == 2 and "unknown ['resnet']; valid: mlp, deep" in proc.stderr
