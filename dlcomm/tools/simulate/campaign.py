"""The measurements that calibrate and validate the simulator on the emulated cluster
(``dlcomm simulate measure calibration|validation --out DIR``; needs root for
``--emulate``). These are timings: run them on a quiet machine.

* calibration: ``dlcomm bench allreduce`` (every algorithm the simulator models, set with
  ``DLCOMM_ALLREDUCE_ALGORITHM``), ``allgather`` and ``reducescatter`` on shared memory (2
  and 4 ranks: the in-host parameters) and on ``2x1gbit``, ``4x1gbit``, ``8x1gbit`` and
  ``2x1gbit`` with 2 slots per host; each bench JSON is wrapped with its setup.
* validation: ``examples/torch_mnist.py --phase-times --json`` for every method on the same
  clusters (and a one-rank run per model for the optimizer step), each wrapped with the
  setup ``dlcomm simulate validate`` needs.

``--dry-run`` prints the commands; ``--quick`` runs a small subset with tiny sizes and few
iterations, to check the plumbing end to end (its figures mean nothing).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "examples" / "torch_mnist.py"
CLUSTERS = (("2x1gbit", 1), ("4x1gbit", 1), ("8x1gbit", 1), ("2x1gbit", 2))
SHARED_MEMORY_RANKS = (2, 4)
CALIBRATION_SIZES = "4K,64K,1M,4M,16M,64M"
ALGORITHM_ENV = "DLCOMM_ALLREDUCE_ALGORITHM"
STRAGGLER = "compute=1:0.5,seed=1"
CONGESTION = "congest=1:100mbit:1:3,seed=1"


@dataclasses.dataclass(frozen=True)
class Job:
    """One command, the environment it adds, where its JSON lands, and the setup recorded
    beside the result."""

    name: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    json_path: Path
    setup: dict[str, Any]

    def shell(self) -> str:
        """The command as one would type it."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        return (env + " " if env else "") + " ".join(shlex.quote(c) for c in self.command)


def _launcher(emulate: str | None, slots: int, np_: int, extra: Sequence[str] = ()
              ) -> list[str]:
    cmd = [sys.executable, "-m", "dlcomm.launcher.dlcommrun"]
    if emulate:
        cmd += ["--emulate", emulate]
        if slots > 1:
            cmd += ["--slots-per-host", str(slots)]
    else:
        cmd += ["-np", str(np_)]
    return cmd + list(extra)


def calibration_jobs(out: Path, *, quick: bool = False) -> list[Job]:
    """The bench runs calibration fits (see the module doc)."""
    sizes, iters = ("4K,64K", ["-w", "1", "-n", "2"]) if quick else \
        (CALIBRATION_SIZES, ["-w", "2", "-n", "10"])
    places: list[tuple[str | None, int, int]] = [(None, 1, n) for n in SHARED_MEMORY_RANKS]
    places += [(spec, slots, 0) for spec, slots in CLUSTERS]
    if quick:
        places = [(None, 1, 2), ("2x1gbit", 1, 0)]
    jobs = []
    for emulate, slots, np_ in places:
        where = f"{emulate}x{slots}" if emulate else f"shm{np_}"
        hosts = int(emulate.split("x")[0]) if emulate else 1
        algorithms = ["ring"] if quick else ["ring", "rhd", "tree"]
        if not quick and (hosts > 1 or np_ > 2):
            algorithms.append("hierarchical")
        benches = [("allreduce", a) for a in algorithms] + [("allgather", ""),
                                                            ("reducescatter", "")]
        for bench, algorithm in benches:
            stem = f"{bench}_{algorithm}" if algorithm else bench
            path = out / "calibration" / f"{stem}_{where}.json"
            cmd = _launcher(emulate, slots, np_) + [
                sys.executable, "-m", "dlcomm.cli.main", "bench", bench, "--sizes", sizes,
                *iters, "--json", str(path)]
            env = ((ALGORITHM_ENV, algorithm),) if algorithm else ()
            setup = {"emulate": emulate or "", "slots_per_host": slots,
                     "allreduce_algorithm": algorithm or "ring"}
            jobs.append(Job(path.stem, tuple(cmd), env, path, setup))
    return jobs


def _methods(workers: int, quick: bool) -> list[tuple[str, list[str], dict[str, str]]]:
    """(simulator method, demo arguments, environment) for every method at ``workers``."""
    ring = {ALGORITHM_ENV: "ring"}
    if quick:
        return [("dense", [], ring), ("acpsgd:rank=4", ["--compression", "acpsgd:rank=4"], ring)]
    out: list[tuple[str, list[str], dict[str, str]]] = [("dense", [], ring)]
    out += [(f"dense {a}", [], {ALGORITHM_ENV: a}) for a in ("rhd", "tree", "hierarchical")]
    out += [(f"dense schedule={s}", ["--schedule", s], ring) for s in ("none", "mgwfbp", "dear")]
    for spec in ("fp16", "topk:ratio=0.01", "gtopk:ratio=0.01", "randomk:ratio=0.01",
                 "powersgd:rank=4", "acpsgd:rank=4", "efsignsgd", "signum", "qsgd:levels=16"):
        out.append((spec, ["--compression", spec], ring))
    if workers >= 4:
        out.append(("dssync:group_size=2", ["--sync", "dssync:group_size=2"], ring))
    return out


def validation_jobs(out: Path, *, quick: bool = False, model: str = "mlp") -> list[Job]:
    """The training runs validation compares with (see the module doc)."""
    epochs = "2" if quick else "3"
    demo = [sys.executable, str(DEMO), "--no-progress", "--phase-times", "--epochs", epochs]
    zoo = {"mlp": "mnist-mlp", "cnn": "mnist-cnn"}
    jobs: list[Job] = []

    def add(name: str, emulate: str | None, slots: int, np_: int, method: str,
            args: Sequence[str], env: dict[str, str], model_: str, batch: int,
            hetero: str = "", launcher_extra: Sequence[str] = ()) -> None:
        path = out / "validation" / f"{name}.json"
        extra = list(launcher_extra) + (["--heterogeneity", hetero] if hetero else [])
        cmd = _launcher(emulate, slots, np_, extra) + demo + [
            "--model", model_, "--batch-size", str(batch), *args, "--json", str(path)]
        setup = {"emulate": emulate or "", "slots_per_host": slots, "model": zoo[model_],
                 "method": method, "heterogeneity": hetero, "batch_size": batch,
                 "allreduce_algorithm": env.get(ALGORITHM_ENV, "native")}
        jobs.append(Job(name, tuple(cmd), tuple(env.items()), path, setup))

    models = [(model, 32)] + ([] if quick else [("cnn", 256)])
    for m, batch in models:
        add(f"reference_{m}{batch}", None, 1, 1, "dense", [], {}, m, batch)
    clusters = [("2x1gbit", 1)] if quick else list(CLUSTERS)
    for spec, slots in clusters:
        hosts = int(spec.split("x")[0])
        workers = hosts * slots
        tag = f"{spec}x{slots}"
        for method, args, env in _methods(workers, quick):
            safe = method.replace(":", "_").replace("=", "").replace(" ", "_").replace(",", "_")
            add(f"{tag}_{model}_{safe}", spec, slots, 0, method, args, env, model, 32)
        if quick:
            continue
        ring = {ALGORITHM_ENV: "ring"}
        # LB-BSP against BSP with host 1 at half compute speed (docs/heterogeneity.md's setup)
        for method, args in (("dense", []), ("lbbsp", ["--sync", "lbbsp"])):
            add(f"{tag}_cnn256_{method}_straggler", spec, slots, 0, method, args, ring, "cnn",
                256, STRAGGLER)
        # DLCP's bounded loss against the lossless all-reduce, host 1's link congested
        for method, args in (("dense", []), ("loss_tolerance=0.1",
                                             ["--loss-tolerance", "0.1"])):
            safe = method.replace("=", "")
            add(f"{tag}_{model}_{safe}_congested", spec, slots, 0, method, args, ring, model,
                32, CONGESTION)
    return jobs


def run_jobs(jobs: Sequence[Job], *, dry_run: bool = False, timeout_s: float = 1800,
             keep_going: bool = False) -> int:
    """Run each job, wrap its JSON as ``{"setup", "command", "result"}``; 1 if any failed."""
    failed = 0
    for i, job in enumerate(jobs, start=1):
        print(f"[{i}/{len(jobs)}] {job.shell()}", flush=True)
        if dry_run:
            continue
        job.json_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.time()
        proc = subprocess.run(job.command, env={**os.environ, **dict(job.env)},
                              capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
        if proc.returncode != 0 or not job.json_path.exists():
            failed += 1
            print(f"    FAILED ({proc.returncode}):\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}",
                  file=sys.stderr, flush=True)
            if not keep_going:
                return 1
            continue
        result = json.loads(job.json_path.read_text())
        if isinstance(result, list):  # the synthetic benchmark writes a list
            result = result[0]
        wrapped = {"setup": job.setup, "command": job.shell(), "result": result,
                   "seconds": round(time.time() - start, 1),
                   "load_average": os.getloadavg()}
        job.json_path.write_text(json.dumps(wrapped, indent=1) + "\n")
        print(f"    ok, {time.time() - start:.0f} s", flush=True)
    return 1 if failed else 0
