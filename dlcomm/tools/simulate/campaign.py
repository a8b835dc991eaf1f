"""The measurements that calibrate and validate the simulator on the emulated cluster
(``dlcomm simulate measure calibration|validation --out DIR``; needs root for
``--emulate``). These are timings: run them on a quiet machine.

Every job sets ``DLCOMM_ALLREDUCE_ALGORITHM`` explicitly (the engine's default may change
again) and records it in its setup as ``allreduce_algorithm``.

* calibration: ``dlcomm bench allreduce`` (every algorithm the simulator models: ordered,
  ordered_tcp, ring, rhd, tree and, with several hosts or 4 ranks, hierarchical),
  ``allgather`` (MPI's under any algorithm) and ``reducescatter`` (the engine's: the
  ordered one under ``ordered``, the mesh's under ``ordered_tcp``, MPI's own under
  ``mpi``) on shared memory (2 and 4 ranks: the in-host parameters) and on ``2x1gbit``,
  ``4x1gbit``, ``8x1gbit`` and ``2x1gbit`` with 2 slots per host, all at the same sizes;
  each bench JSON is wrapped with its setup.
* validation: ``examples/torch_mnist.py --phase-times --json`` for every method on the same
  clusters (and one-rank runs: per model, for the optimizer step; per compressor, for its
  cost in the training path with a core to itself), with ``auto`` unless
  the method names another algorithm, each wrapped with the setup ``dlcomm simulate
  validate`` needs.

``--dry-run`` prints the commands and how many jobs there are; ``--only REGEX`` keeps the
jobs whose name matches (``re.search``), to run part of a campaign in a quiet window;
``--quick`` runs a small subset with tiny sizes and few iterations, to check the plumbing
end to end (its figures mean nothing).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlcomm.comm.machine import local_core_count

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "examples" / "torch_mnist.py"
CLUSTERS = (("2x1gbit", 1), ("4x1gbit", 1), ("8x1gbit", 1), ("2x1gbit", 2))
SHARED_MEMORY_RANKS = (2, 4)
CALIBRATION_SIZES = "4K,64K,1M,4M,16M,64M"
ALGORITHM_ENV = "DLCOMM_ALLREDUCE_ALGORITHM"
DEFAULT_ALGORITHM = "auto"  # the engine's default, set explicitly all the same
# Calibration times fixed algorithms (auto picks by size, which no one formula fits); the
# all-gather is MPI's under any of them.
CALIBRATION_ALGORITHM = "ordered"
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
        algorithms = (["ordered"] if quick
                      else ["ordered", "ordered_tcp", "ring", "rhd", "tree"])
        if not quick and (hosts > 1 or np_ > 2):
            algorithms.append("hierarchical")
        # (bench, DLCOMM_ALLREDUCE_ALGORITHM, whether the algorithm names the job): the
        # all-gather is MPI's under any algorithm; the engine's reduce-scatter is the
        # ordered one under ordered, the mesh's under ordered_tcp and MPI's own under mpi
        # (and every other algorithm).
        benches = [("allreduce", a, True) for a in algorithms]
        benches += [("allgather", CALIBRATION_ALGORITHM, False),
                    ("reducescatter", "ordered", True)]
        if not quick:
            benches += [("reducescatter", "ordered_tcp", True), ("reducescatter", "mpi", True)]
        for bench, algorithm, named in benches:
            stem = f"{bench}_{algorithm}" if named else bench
            path = out / "calibration" / f"{stem}_{where}.json"
            cmd = _launcher(emulate, slots, np_) + [
                sys.executable, "-m", "dlcomm.cli.main", "bench", bench, "--sizes", sizes,
                *iters, "--json", str(path)]
            setup = {"emulate": emulate or "", "slots_per_host": slots,
                     "allreduce_algorithm": algorithm}
            jobs.append(Job(path.stem, tuple(cmd), ((ALGORITHM_ENV, algorithm),), path, setup))
    return jobs


# The compressors validated, each also run on one rank: its cost in the training path alone.
COMPRESSORS = ("fp16", "topk:ratio=0.01", "gtopk:ratio=0.01", "randomk:ratio=0.01",
               "powersgd:rank=4", "acpsgd:rank=4", "efsignsgd", "signum", "qsgd:levels=16")


def _slug(method: str) -> str:
    """A method as part of a job name."""
    return method.replace(":", "_").replace("=", "").replace(" ", "_").replace(",", "_")


def _methods(workers: int, quick: bool) -> list[tuple[str, list[str], dict[str, str]]]:
    """(simulator method, demo arguments, environment) for every method at ``workers``; a
    method that names no algorithm runs the engine's default, ``auto``."""
    default = {ALGORITHM_ENV: DEFAULT_ALGORITHM}
    if quick:
        return [("dense", [], default),
                ("acpsgd:rank=4", ["--compression", "acpsgd:rank=4"], default)]
    out: list[tuple[str, list[str], dict[str, str]]] = [("dense", [], default)]
    out += [(f"dense {a}", [], {ALGORITHM_ENV: a})
            for a in ("ring", "rhd", "tree", "hierarchical")]
    out += [(f"dense schedule={s}", ["--schedule", s], default)
            for s in ("none", "mgwfbp", "dear")]
    for spec in COMPRESSORS:
        out.append((spec, ["--compression", spec], default))
    if workers >= 4:
        out.append(("dssync:group_size=2", ["--sync", "dssync:group_size=2"], default))
    return out


def validation_jobs(out: Path, *, quick: bool = False, model: str = "mlp") -> list[Job]:
    """The training runs validation compares with (see the module doc)."""
    epochs = "2" if quick else "3"
    demo = [sys.executable, str(DEMO), "--no-progress", "--phase-times", "--epochs", epochs]
    zoo = {"mlp": "mnist-mlp", "cnn": "mnist-cnn"}
    cores = local_core_count()  # the emulated hosts share this machine's cores
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
                 "allreduce_algorithm": env[ALGORITHM_ENV], "machine_cores": cores}
        jobs.append(Job(name, tuple(cmd), tuple(env.items()), path, setup))

    default = {ALGORITHM_ENV: DEFAULT_ALGORITHM}
    models = [(model, 32)] + ([] if quick else [("cnn", 256)])
    for m, batch in models:
        add(f"reference_{m}{batch}", None, 1, 1, "dense", [], default, m, batch)
    for spec in (() if quick else COMPRESSORS):  # compression's cost with a core to itself
        add(f"reference_{model}32_{_slug(spec)}", None, 1, 1, spec, ["--compression", spec],
            default, model, 32)
    clusters = [("2x1gbit", 1)] if quick else list(CLUSTERS)
    for spec, slots in clusters:
        hosts = int(spec.split("x")[0])
        workers = hosts * slots
        tag = f"{spec}x{slots}"
        for method, args, env in _methods(workers, quick):
            add(f"{tag}_{model}_{_slug(method)}", spec, slots, 0, method, args, env, model, 32)
        if quick:
            continue
        # LB-BSP against BSP with host 1 at half compute speed (docs/heterogeneity.md's setup)
        for method, args in (("dense", []), ("lbbsp", ["--sync", "lbbsp"])):
            add(f"{tag}_cnn256_{method}_straggler", spec, slots, 0, method, args, default,
                "cnn", 256, STRAGGLER)
        # DLCP's bounded loss against the lossless all-reduce, host 1's link congested
        for method, args in (("dense", []), ("loss_tolerance=0.1",
                                             ["--loss-tolerance", "0.1"])):
            safe = method.replace("=", "")
            add(f"{tag}_{model}_{safe}_congested", spec, slots, 0, method, args, default,
                model, 32, CONGESTION)
    return jobs


def select_jobs(jobs: Sequence[Job], only: str | None) -> list[Job]:
    """The jobs whose name matches the regular expression ``only`` (``re.search``; None:
    all of them); ValueError for a bad expression or one that matches no job."""
    if only is None:
        return list(jobs)
    try:
        pattern = re.compile(only)
    except re.error as exc:
        raise ValueError(f"--only {only!r} is not a regular expression: {exc}") from None
    chosen = [job for job in jobs if pattern.search(job.name)]
    if not chosen:
        names = ", ".join(job.name for job in jobs[:5])
        raise ValueError(f"--only {only!r} matches none of the {len(jobs)} jobs (their "
                         f"names look like {names}, ...; --dry-run lists them)")
    return chosen


def run_jobs(jobs: Sequence[Job], *, dry_run: bool = False, timeout_s: float = 1800,
             keep_going: bool = False) -> int:
    """Run each job, wrap its JSON as ``{"setup", "command", "result"}``; 1 if any failed.
    ``dry_run`` prints each job's name and command, then how many jobs there are."""
    failed = 0
    for i, job in enumerate(jobs, start=1):
        print(f"[{i}/{len(jobs)}] {job.name}: {job.shell()}", flush=True)
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
    if dry_run:
        print(f"{len(jobs)} job{'s' if len(jobs) != 1 else ''} (dry run: nothing ran)")
    return 1 if failed else 0
