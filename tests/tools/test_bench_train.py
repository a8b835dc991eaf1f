"""``dlcomm bench train`` against torch DDP: which hook is whose peer, rounds that alternate
the frameworks, the ratio arithmetic, the loss check, and a tiny real run on 2 ranks (DDP
over gloo and dlcomm, each its own dlcommrun job, one round). No time is asserted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlcomm.tools.bench import ddp_peer, train


def test_each_compressor_maps_to_its_ddp_hook_or_none() -> None:
    assert ddp_peer.ddp_hook_name("none") == "allreduce (no hook)"
    assert ddp_peer.ddp_hook_name("fp16") == "fp16_compress_hook"
    assert ddp_peer.ddp_hook_name("powersgd:rank=4") == "powerSGD_hook"
    assert ddp_peer.ddp_hook_name("acpsgd:rank=4") is None
    assert ddp_peer.ddp_hook_name("topk:ratio=0.01") is None
    assert ddp_peer.ddp_hook_name("powersgd:rank=4+fp16") is None  # a cast: no DDP peer
    with pytest.raises(ValueError, match="unknown compressor"):
        ddp_peer.ddp_hook_name("nope")


def test_rendezvous_follows_the_emulated_network(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ddp_peer.rendezvous_host(False) == ("127.0.0.1", "lo")
    assert ddp_peer.rendezvous_host(True) == ("dlc-h0", "dlc-eth0")
    monkeypatch.setenv("DLCOMM_EMULATE", "4x1gbit")
    assert ddp_peer.rendezvous_host() == ("dlc-h0", "dlc-eth0")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert ddp_peer.mpi_rank_size() == (2, 3)


def test_same_loss_uses_each_compressors_tolerance() -> None:
    assert train.same_loss("none", 0.5, 0.5 * (1 + 5e-4))
    assert not train.same_loss("none", 0.5, 0.51)
    assert train.same_loss("fp16", 0.5, 0.505)
    assert not train.same_loss("fp16", 0.5, 0.6)
    assert train.same_loss("powersgd:rank=4", 2.0, 1.8)
    assert not train.same_loss("powersgd:rank=4", 2.0, 0.5)
    assert not train.same_loss("none", float("nan"), float("nan"))


def test_lists_and_job_commands() -> None:
    assert train.parse_list("none,fp16") == ["none", "fp16"]
    assert train.parse_list("topk:ratio=0.01,approx=1;none") == ["topk:ratio=0.01,approx=1",
                                                                "none"]
    # with commas only, a spec's own parameters stay with it
    assert train.parse_list("topk:ratio=0.01,approx=1") == ["topk:ratio=0.01,approx=1"]
    assert train.parse_list("none,topk:ratio=0.1,approx=1,fp16") == [
        "none", "topk:ratio=0.1,approx=1", "fp16"]
    with pytest.raises(ValueError, match="empty"):
        train.parse_list(" , ")
    settings = train.TrainSettings(model="tiny", iters=2, emulate="4x1gbit")
    ddp = train.job_command("ddp", 4, "fp16", "wfbp", settings, "/tmp/x.json")
    assert ddp[:5] == ["dlcommrun", "-np", "4", "--emulate", "4x1gbit"]
    assert "--schedule" not in ddp and ddp[ddp.index("--framework") + 1] == "ddp"
    ours = train.job_command("dlcomm", 1, "fp16", "dear", settings, "/tmp/x.json")
    assert "--emulate" not in ours  # one rank has no network to emulate
    assert ours[ours.index("--schedule") + 1] == "dear"
    assert ours[ours.index("--num-iters") + 1] == "2"
    assert "--slots-per-host" not in ddp  # one rank per emulated host: dlcommrun's default
    hosts = train.TrainSettings(model="tiny", emulate="2x1gbit", slots_per_host=2)
    two_by_two = train.job_command("dlcomm", 4, "htopk", "wfbp", hosts, "/tmp/x.json")
    assert two_by_two[:7] == ["dlcommrun", "-np", "4", "--emulate", "2x1gbit",
                              "--slots-per-host", "2"]


def _fake_jobs(monkeypatch: pytest.MonkeyPatch, speeds: dict[str, list[float]]) -> list:
    calls = []
    left = {k: iter(v) for k, v in speeds.items()}

    def fake_run(framework, np_, compression, schedule, settings):
        calls.append((framework, np_, compression, schedule))
        rate = 50.0 if np_ == 1 else next(left[framework])
        loss = {"ddp": 0.30, "dlcomm": 0.3001}[framework] if compression == "none" else 0.9
        return {"per_rank_samples_per_s": rate, "total_samples_per_s": rate, "steps": 30,
                "lr": 0.04, "momentum": 0.9, "final_loss": loss}

    monkeypatch.setattr(train, "run_config", fake_run)
    return calls


def test_rounds_alternate_frameworks_and_ratios_are_of_medians(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # dlcomm's jobs per round: none wfbp, none dear, acpsgd wfbp, acpsgd dear (reversed in
    # round 2); the acpsgd rows get 10 samples/s throughout.
    calls = _fake_jobs(monkeypatch, {"dlcomm": [400.0, 100.0, 10.0, 10.0, 300.0, 120.0, 10.0,
                                                10.0, 250.0, 90.0, 10.0, 10.0],
                                     "ddp": [200.0, 150.0, 100.0]})
    settings = train.TrainSettings(model="tiny")
    rows = train.measure(4, ["none", "acpsgd:rank=4"], ["wfbp", "dear"], settings, repeats=3)
    multi = [(f, c, s) for f, np_, c, s in calls if np_ == 4]
    # Round 1 dlcomm first, round 2 DDP first, round 3 dlcomm first; acpsgd has no DDP peer.
    assert multi[:3] == [("dlcomm", "none", "wfbp"), ("dlcomm", "none", "dear"),
                         ("ddp", "none", "wfbp")]
    assert multi[5:8] == [("ddp", "none", "wfbp"), ("dlcomm", "none", "dear"),
                          ("dlcomm", "none", "wfbp")]
    assert [r["rounds"] for r in rows[:2]] == [[400.0, 120.0, 250.0], [100.0, 300.0, 90.0]]
    wfbp = rows[0]
    ddp = wfbp["peers"]["ddp"]
    assert ddp["rounds"] == [200.0, 150.0, 100.0] and ddp["total_samples_per_s"] == 150.0
    assert wfbp["total_samples_per_s"] == 250.0
    assert ddp["dlcomm_over_peer"] == pytest.approx(250.0 / 150.0)
    assert ddp["dlcomm_over_peer_paired"] == pytest.approx(2.0)  # median of 2.0, 0.8, 2.5
    assert ddp["ms_per_iteration"] == pytest.approx(1e3 * 32 * 4 / 150.0)
    assert ddp["same_loss"] and ddp["hook"] == "allreduce (no hook)"
    assert rows[1]["peers"]["ddp"]["dlcomm_over_peer"] == pytest.approx(100.0 / 150.0)
    assert rows[2]["peers"] == {} and rows[3]["peers"] == {}
    assert wfbp["scaling_efficiency"] == pytest.approx(250.0 / (50.0 * 4))
    table = train.markdown_table(rows)
    assert "| `none` | wfbp | 512 | 250.0 | `allreduce (no hook)` | 853 | 1.67x (2.00x) |" \
        in table
    assert "0.3001 / 0.3 |" in table and "400, 120, 250 / 200, 150, 100" in table
    assert "| `acpsgd:rank=4` | wfbp |" in table and "| none | - | - |" in table


def test_without_scaling_no_one_rank_jobs_run(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_jobs(monkeypatch, {"dlcomm": [100.0], "ddp": [100.0]})
    rows = train.measure(2, ["fp16"], ["wfbp"], train.TrainSettings(), scaling=False)
    assert [np_ for _, np_, _, _ in calls] == [2, 2]
    assert "scaling_efficiency" not in rows[0]
    assert "scaling efficiency" not in train.markdown_table(rows)
    with pytest.raises(ValueError, match="unknown peer"):
        train.measure(2, ["fp16"], ["wfbp"], train.TrainSettings(), peers=("horovod",))


def test_tiny_real_run_against_ddp(tmp_path: Path) -> None:
    """2 ranks, DDP (gloo) and dlcomm on the tiny model, one round (the alternation of rounds
    and the medians over them are test_rounds_alternate_frameworks_and_ratios_are_of_medians'
    business; each job is a fresh start of torch on every rank): both finish, the JSON holds
    both frameworks' figures, the ratios are those figures' ratios, and dense training
    reached the same loss through both."""
    out = tmp_path / "train.json"
    cmd = [sys.executable, "-m", "dlcomm.cli.main", "bench", "train", "--np", "2", "--model",
           "tiny", "--configs", "none", "--iters", "1", "--batches-per-iter", "2",
           "--warmup", "1", "--repeats", "1", "--no-scaling", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    ddp = row["peers"]["ddp"]
    assert row["ranks"] == 2 and row["steps"] == 3
    (ours,), (peer,) = row["rounds"], ddp["rounds"]
    assert ours > 0 and peer > 0
    assert row["total_samples_per_s"] == pytest.approx(ours)
    assert ddp["total_samples_per_s"] == pytest.approx(peer)
    assert ddp["dlcomm_over_peer"] == pytest.approx(ours / peer)
    assert ddp["dlcomm_over_peer_paired"] == pytest.approx(ours / peer)
    assert ddp["same_loss"] is True
    assert row["final_loss"] == pytest.approx(ddp["final_loss"], rel=1e-4)
    assert "dlcomm / DDP speed" in proc.stdout and "ddp round 1/1" in proc.stdout
    # per round: rank 0's time of each timed iteration, and CPU time per iteration
    (times,), (cpu,) = row["iteration_ms"], row["cpu_ms_per_iteration"]
    assert len(times) == 1 and times[0] > 0
    assert times[0] == pytest.approx(1e3 * 2 * 32 / (ours / 2), rel=0.5)  # rank 0 alone
    assert cpu["main_thread"] > 0 and cpu["other_threads"] >= 0
    (peer_cpu,) = ddp["cpu_ms_per_iteration"]
    assert peer_cpu["main_thread"] > 0 and len(ddp["iteration_ms"][0]) == 1
