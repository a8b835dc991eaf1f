"""``dlcomm bench fl`` and ``fl-schedule``: the process-tree memory sampler, the summary and
ratios, the scheduler arithmetic, and the whole bench end to end at a tiny size without
Flower (Flower's own side needs flwr[simulation], in its own environment: see docs/fl.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dlcomm.cli import main as cli
from dlcomm.tools.bench import fl as bench_fl
from dlcomm.tools.bench.process_memory import TreeMemorySampler, rss_bytes, tree_pids


def test_sampler_sums_a_process_tree(tmp_path: Path) -> None:
    child = ("import subprocess, sys, time\n"
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)'])\n"
             "time.sleep(3); p.wait()\n")
    proc = subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
    try:
        time.sleep(1.0)
        pids = tree_pids(proc.pid)
        assert proc.pid in pids and len(pids) == 2
        with TreeMemorySampler(proc.pid, interval=0.05) as s:
            time.sleep(0.3)
        assert s.peak_count == 2
        assert s.peak_rss >= sum(rss_bytes(p) for p in pids) // 2 > 0
        assert s.peak_pss > 0
    finally:
        proc.wait()
    assert tree_pids(proc.pid) == []


def test_summary_ratios_and_table() -> None:
    runs = [
        {"side": "dlcomm", "median_round_seconds": 1.0, "peak_rss_bytes": 100 << 20,
         "peak_pss_bytes": 80 << 20, "max_abs_diff_to_reference": 0.0, "accuracy": 0.9},
        {"side": "flower", "median_round_seconds": 3.0, "peak_rss_bytes": 400 << 20,
         "peak_pss_bytes": 160 << 20, "max_abs_diff_to_reference": 1e-7, "accuracy": 0.9},
        {"side": "dlcomm", "median_round_seconds": 2.0, "peak_rss_bytes": 120 << 20,
         "peak_pss_bytes": 80 << 20, "max_abs_diff_to_reference": 0.0, "accuracy": 0.9}]
    s = bench_fl.summarise({"clients": 10, "runs": runs,
                            "one_process_per_client_estimate_bytes": 2400 << 20})
    assert s["dlcomm"]["median_round_seconds"] == 1.5
    assert s["flower_over_dlcomm_round_time"] == 2.0
    assert s["flower_over_dlcomm_rss"] == pytest.approx(400 / 120)
    assert s["flower_over_dlcomm_pss"] == 2.0
    assert s["estimate_over_dlcomm_rss"] == 20.0
    text = bench_fl.table([s])
    assert "Flower/dlcomm time per round 2.00x" in text and "estimate" in text


def test_fl_schedule_beats_the_static_split(tmp_path: Path, capsys) -> None:
    out = tmp_path / "schedule.json"
    assert cli.main(["bench", "fl-schedule", "--dataset", "digits", "--clients", "200",
                     "--clients-per-round", "30", "--ranks", "3", "--rounds", "10",
                     "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert 1.0 <= summary["oracle"]["median"] <= summary["lpt"]["median"]
    assert summary["lpt"]["median"] < summary["static"]["median"]
    assert "| lpt |" in capsys.readouterr().out


def test_bench_fl_runs_end_to_end_without_flower(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "fl.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "dlcomm.cli.main", "bench", "fl", "--no-flower", "--np", "2",
         "--client-counts", "5", "--clients-per-round", "3", "--rounds", "2", "--repeats", "1",
         "--dataset", "digits", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    s = result["summaries"][0]
    assert s["clients"] == 5 and "flower" not in s
    assert s["dlcomm"]["max_abs_diff_to_reference"] <= 1e-5
    assert s["dlcomm"]["peak_rss_bytes"] > 0
    assert s["one_process_per_client_estimate_bytes"] > 0
    sides = [r["side"] for r in result["counts"][0]["runs"]]
    assert sides == ["reference", "one-client", "dlcomm"]
    assert "max abs diff to reference" in proc.stdout


def test_max_abs_diff(tmp_path: Path) -> None:
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    np.savez(a, w=np.zeros(3, np.float32))
    np.savez(b, w=np.array([0, 0.5, 0], np.float32))
    assert bench_fl.max_abs_diff(str(a), str(b)) == 0.5
    np.savez(b, v=np.zeros(3))
    assert bench_fl.max_abs_diff(str(a), str(b)) == float("inf")
