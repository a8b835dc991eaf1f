"""Seeded fault runs: an elastic job (``elastic_digits``) on the emulated cluster, one fault
injected after a seeded commit step on a seeded worker, judged by the job's exit code, its
event logs (recovery time, lost commits), its final accuracy against an uninterrupted run,
and whether the driver's log names the worker that failed."""
from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dlcomm.tools.faults.events import (
    Recovery,
    judge,
    read_events,
    running_workers,
    wait_for_commit,
)
from dlcomm.tools.faults.inject import KINDS, inject

STEPS_PER_EPOCH_4_RANKS = 23  # digits' 1437 training samples, 16 per rank, 4 ranks


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """One elastic job of a campaign."""

    emulate: str = "4x1gbit"
    min_np: int = 2
    max_np: int = 4
    epochs: int = 6
    step_seconds: float = 0.0
    timeout_s: float = 600.0


@dataclasses.dataclass
class FaultRun:
    """What happened in one run (``kind`` None: the uninterrupted baseline)."""

    kind: str | None
    seed: int
    exit_code: int
    wall_s: float
    accuracy: float | None
    ranks_at_end: int | None
    fault_step: int | None = None
    victim: str = ""
    action: str = ""
    recovery: Recovery | None = None
    log_names_failure: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.recovery is not None:
            data["committed_step_lost"] = self.recovery.committed_step_lost
        return data


def job_command(settings: JobSettings, events: Path, result: Path) -> list[str]:
    """The dlcommrun command line of one run."""
    return [sys.executable, "-m", "dlcomm.launcher.dlcommrun", "--emulate", settings.emulate,
            "--min-np", str(settings.min_np), "--max-np", str(settings.max_np),
            sys.executable, "-m", "dlcomm.tools.faults.elastic_digits",
            "--epochs", str(settings.epochs), "--step-seconds", str(settings.step_seconds),
            "--events", str(events), "--json", str(result)]


def run_one(settings: JobSettings, kind: str | None, seed: int, workdir: Path) -> FaultRun:
    """One job with fault ``kind`` (or none) placed by ``seed``; its logs stay in
    ``workdir``."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"fault kind must be one of {', '.join(KINDS)}, got {kind!r}")
    rng = random.Random(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    events_dir, result_path = workdir / "events", workdir / "result.json"
    started = time.monotonic()
    with open(workdir / "driver.log", "w") as log:
        proc = subprocess.Popen(job_command(settings, events_dir, result_path),
                                stdout=log, stderr=subprocess.STDOUT)
        run = FaultRun(kind, seed, 0, 0.0, None, None)
        try:
            if kind is not None:
                total = settings.epochs * STEPS_PER_EPOCH_4_RANKS
                run.fault_step = rng.randrange(max(total // 10, 1), max(total * 6 // 10, 2))
                events = wait_for_commit(events_dir, run.fault_step, settings.timeout_s)
                workers = running_workers(events)
                run.victim = rng.choice(sorted(workers))
                victim = workers[run.victim]
                fault_time = time.time()
                run.action = inject(kind, victim["pid"], victim["host"])
            run.exit_code = proc.wait(timeout=settings.timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    run.wall_s = time.monotonic() - started
    if result_path.exists():
        result = json.loads(result_path.read_text())
        run.accuracy, run.ranks_at_end = result["accuracy"], result["ranks"]
    if kind is not None:
        run.recovery = judge(read_events(events_dir), fault_time)
        failures = [line for line in (workdir / "driver.log").read_text().splitlines()
                    if "FAILURE" in line]
        run.log_names_failure = any(f"worker {run.victim} " in line for line in failures)
    return run


def campaign(settings: JobSettings, kinds: list[str], runs: int, seed: int,
             workdir: Path) -> tuple[FaultRun, list[FaultRun]]:
    """An uninterrupted baseline, then ``runs`` fault runs cycling through ``kinds`` with
    seeds ``seed``, ``seed + 1``, ..."""
    baseline = run_one(settings, None, seed, workdir / "baseline")
    results = []
    for i in range(runs):
        kind = kinds[i % len(kinds)]
        results.append(run_one(settings, kind, seed + i, workdir / f"run{i:02d}-{kind}"))
    return baseline, results


def summary_table(baseline: FaultRun, runs: list[FaultRun]) -> str:
    """A markdown table of the runs and a line of totals."""
    lines = ["| run | fault | seed | after commit | victim | recovery s | last commit | "
             "resumed at | ranks after | accuracy | vs baseline | exit | log names it |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = baseline.accuracy
    for i, run in enumerate(runs):
        rec = run.recovery
        delta = (f"{(run.accuracy - base) * 100:+.1f} pt"
                 if run.accuracy is not None and base is not None else "-")
        lines.append(
            f"| {i} | {run.kind} | {run.seed} | {run.fault_step} | {run.victim} | "
            f"{'-' if rec is None or rec.recovery_s is None else f'{rec.recovery_s:.1f}'} | "
            f"{'-' if rec is None else rec.last_commit} | "
            f"{'-' if rec is None else rec.resumed_step} | "
            f"{'-' if rec is None else rec.ranks_after} | "
            f"{'-' if run.accuracy is None else f'{run.accuracy:.4f}'} | {delta} | "
            f"{run.exit_code} | {'yes' if run.log_names_failure else 'no'} |")
    finished = sum(r.exit_code == 0 for r in runs)
    lost = sum(r.recovery is not None and r.recovery.committed_step_lost for r in runs)
    times = sorted(r.recovery.recovery_s for r in runs
                   if r.recovery is not None and r.recovery.recovery_s is not None)
    close = sum(r.accuracy is not None and base is not None and abs(r.accuracy - base) <= 0.01
                for r in runs)
    lines.append("")
    lines.append(
        f"Baseline (no fault): accuracy {base if base is None else f'{base:.4f}'}, exit "
        f"{baseline.exit_code}, {baseline.wall_s:.0f} s. {finished}/{len(runs)} runs finished; "
        f"{lost} lost a committed step; {close}/{len(runs)} within 1 point of the baseline; "
        + (f"recovery median {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s."
           if times else "no recovery measured."))
    return "\n".join(lines)
