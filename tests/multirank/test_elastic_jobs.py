"""Elastic jobs end to end on this machine (``dlcommrun --min-np/--max-np``, real worker
processes training ``elastic_digits``): rank 0 killed after a commit leaves a job that
re-forms without it, loses no committed step, and names the failure in the driver's log;
then a slot added by the discovery script brings in a worker that receives the survivors'
state and trains with them to the end; a Keras job (whose graph functions wrap dlcomm's
errors in TensorFlow's) recovers the same way."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from framework_required import require_framework

from dlcomm.launcher.dlcommrun import without_enclosing_mpi_job
from dlcomm.tools.faults.events import judge, read_events, running_workers, wait_for_commit

TIMEOUT_S = 240


def _start(tmp_path: Path, elastic_args: list[str], epochs: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "dlcomm.launcher.dlcommrun", *elastic_args,
               sys.executable, "-m", "dlcomm.tools.faults.elastic_digits",
               "--epochs", str(epochs), "--step-seconds", "0.02", "--commit-every", "4",
               "--events", str(tmp_path / "events"), "--json", str(tmp_path / "result.json")]
    log = open(tmp_path / "driver.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                            env=without_enclosing_mpi_job(os.environ))


def _finish(proc: subprocess.Popen, tmp_path: Path) -> tuple[int, dict, str]:
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the elastic job did not finish:\n"
                             + (tmp_path / "driver.log").read_text()[-5000:]) from None
    log = (tmp_path / "driver.log").read_text()
    result_path = tmp_path / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    return code, result, log


def _wait_for_commit(proc: subprocess.Popen, tmp_path: Path, step: int) -> list[dict]:
    try:
        return wait_for_commit(tmp_path / "events", step, TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        raise AssertionError((tmp_path / "driver.log").read_text()[-5000:]) from None


def test_job_loses_rank_0_then_grows_with_a_discovered_slot(tmp_path: Path) -> None:
    """One job, two events (each job costs start-up time): rank 0 is killed after a commit
    (the state must then come from a survivor), and later a slot the discovery script adds
    brings in a newcomer that starts from the survivors' commit."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:3\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    proc = _start(tmp_path, ["--min-np", "2", "--max-np", "3",
                             "--host-discovery-script", str(script)], epochs=4)
    events = _wait_for_commit(proc, tmp_path, 12)
    victim = next(e for e in running_workers(events).values() if e["rank"] == 0)
    fault_time = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    recovery = None
    while recovery is None or recovery.resumed_step is None:  # resumed on the survivors
        time.sleep(0.2)
        recovery = judge(read_events(tmp_path / "events"), fault_time)
        assert proc.poll() is None, (tmp_path / "driver.log").read_text()[-5000:]
    _wait_for_commit(proc, tmp_path, recovery.resumed_step + 8)
    hosts.write_text("localhost:4\n")  # the killed slot stays retired: slot 3 is new
    code, result, log = _finish(proc, tmp_path)
    assert code == 0, log[-5000:]

    assert f"FAILURE: worker {victim['worker']} on localhost" in log and "SIGKILL" in log
    assert recovery.ranks_after == 2 and not recovery.committed_step_lost, recovery

    assert "hosts now localhost:4" in log and "started worker w3 on localhost slot 3" in log
    assert result["ranks"] == 3 and result["identical_parameters"], result
    events = read_events(tmp_path / "events")
    joined = next(e for e in events if e["worker"] == "w3" and e["event"] == "start")
    survivors_before = [e["step"] for e in events if e["event"] == "commit"
                        and e["worker"] != "w3" and e["time"] < joined["time"]]
    # The survivors stop at the commit that sees the new slot (it saves, then raises
    # HostsUpdatedInterrupt) and all three start from it: the newcomer gets their state.
    restarted = {e["worker"]: e["step"] for e in events
                 if e["event"] == "start" and e["time"] >= joined["time"] - 1.0}
    assert len(restarted) == 3 and "w3" in restarted, restarted
    assert len(set(restarted.values())) == 1 and joined["step"] >= max(survivors_before) > 0


def test_keras_job_recovers_from_a_killed_worker(tmp_path: Path) -> None:
    require_framework("tensorflow", install="make install-tensorflow")
    toy = Path(__file__).resolve().parents[1] / "keras_elastic_toy.py"
    log = open(tmp_path / "driver.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlcomm.launcher.dlcommrun", "--min-np", "1", "--max-np", "2",
         sys.executable, str(toy), str(tmp_path)],
        stdout=log, stderr=subprocess.STDOUT, env=without_enclosing_mpi_job(os.environ))
    deadline = time.monotonic() + TIMEOUT_S
    victim = None
    while victim is None and time.monotonic() < deadline:
        lines = (tmp_path / "w1.log").read_text().split("\n") if (tmp_path / "w1.log").exists() \
            else []
        commits = [line.split() for line in lines if line.startswith("commit")]
        if commits and int(commits[-1][1]) >= 20:
            victim = int(commits[-1][2])
        time.sleep(0.1)
    assert victim is not None, (tmp_path / "driver.log").read_text()[-5000:]
    os.kill(victim, signal.SIGKILL)
    code, _, text = _finish(proc, tmp_path)
    assert code == 0, text[-5000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"ranks": 1, "identical": True, "steps": 100}, result
    starts = [line.split() for line in (tmp_path / "w0.log").read_text().splitlines()
              if line.startswith("start")]
    assert len(starts) == 2 and starts[1][2] == "1" and int(starts[1][1]) >= 20, starts
