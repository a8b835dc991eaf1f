"""``dlcomm bench kfac``: distributed K-FAC through dlcomm against kfac-pytorch.

A driver (not run under ``dlcommrun``): each round starts one job per framework on ``--np``
ranks (``dlcomm.tools.bench.kfac_job``), on shared memory or on an emulated cluster, with the same
model, data, batch and hyper-parameters; the order of the frameworks alternates from round
to round. It prints, per framework, the time per training iteration (mean over the timed
iterations, which include the periodic inverse updates, and the median), rank 0's CPU time
per step (every thread of its process: where ranks share cores, the time that decides) and
the held-out accuracy after each epoch, and kfac-pytorch's time over dlcomm's.

    pip install --no-deps --target /work/peers/kfac-site /work/peers/kfac-pytorch
    dlcomm bench kfac --np 4 --peer-path /work/peers/kfac-site --repeats 3
    dlcomm bench kfac --np 4 --emulate 4x1gbit --peer-path /work/peers/kfac-site
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dlcomm.tools.bench.kfac_job import FRAMEWORKS

# job options the driver passes through unchanged: (flag, type, default, help)
JOB_OPTIONS: tuple[tuple[str, type, Any, str], ...] = (
    ("--epochs", int, 3, "epochs per job"),
    ("--batch-size", int, 32, "batch per rank"),
    ("--max-steps", int, 0, "steps per epoch at most (0: the whole epoch)"),
    ("--width", int, 16, "channels of the CNN's first convolution"),
    ("--lr", float, 0.05, "learning rate per rank (scaled by the ranks, as kfac-pytorch's "
     "examples do); also K-FAC's lr"),
    ("--momentum", float, 0.9, "SGD momentum"),
    ("--factor-update-steps", int, 1, "K-FAC factor_update_steps"),
    ("--inv-update-steps", int, 10, "K-FAC inv_update_steps"),
    ("--damping", float, 0.03, "K-FAC damping"),
    ("--factor-decay", float, 0.95, "K-FAC factor_decay"),
    ("--kl-clip", float, 0.001, "K-FAC kl_clip"),
    ("--compute-method", str, "eigen", "eigen or inverse"),
    ("--grad-worker-fraction", float, 1.0, "1: COMM-OPT, 1/np: MEM-OPT, between: HYBRID-OPT"),
    ("--warmup", int, 3, "first iterations left out of the times"),
    ("--threads", int, 1, "torch threads per rank"),
    ("--seed", int, 42, "seed of the weights and the data order"),
)


def free_port() -> int:
    """A TCP port nobody listens on here (the emulated hosts have their own, all free)."""
    for _ in range(50):
        port = random.randint(20000, 45000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free TCP port found for torch.distributed's rendezvous")


def job_command(framework: str, np_: int, emulate: str | None, options: dict[str, Any],
                json_path: Path, peer_path: str | None, symmetry_aware: int | None,
                port: int) -> list[str]:
    """The ``dlcommrun`` command of one job."""
    cmd = ["dlcommrun", "-np", str(np_)]
    if emulate:
        cmd += ["--emulate", emulate]
    cmd += [sys.executable, "-m", "dlcomm.tools.bench.kfac_job", "--framework", framework,
            "--json", str(json_path)]
    for flag, _, _, _ in JOB_OPTIONS:
        cmd += [flag, str(options[flag.lstrip("-").replace("-", "_")])]
    if symmetry_aware is not None:
        cmd += ["--symmetry-aware", str(symmetry_aware)]
    if framework == "kfac-pytorch":
        if peer_path:
            cmd += ["--peer-path", peer_path]
        cmd += ["--master-port", str(port)]
    return cmd


def run_job(cmd: list[str], json_path: Path, timeout: float) -> dict[str, Any]:
    """Run one job in its own session; on timeout its whole process tree (mpirun and every
    rank) is killed, so no rank is left running beside the next job."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise RuntimeError(f"{' '.join(cmd)} ran past {timeout:.0f} s (--timeout):\n"
                           f"{out[-2000:]}\n{err[-3000:]}") from None
    if proc.returncode != 0 or not json_path.exists():
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{out[-2000:]}\n{err[-3000:]}")
    return json.loads(json_path.read_text())


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per framework: medians over rounds of the mean and median iteration time, the
    accuracy after each epoch (mean over rounds) and each round's figures."""
    out: dict[str, dict[str, Any]] = {}
    for framework, rounds in results.items():
        means = [statistics.fmean(r["iteration_s"]) for r in rounds]
        medians = [statistics.median(r["iteration_s"]) for r in rounds]
        epochs = len(rounds[0]["epochs"])
        accuracy = [statistics.fmean(r["epochs"][e]["accuracy"] for r in rounds)
                    for e in range(epochs)]
        out[framework] = {"iteration_mean_s": statistics.median(means),
                          "iteration_median_s": statistics.median(medians),
                          "rounds_mean_s": means, "accuracy": accuracy,
                          "cpu_per_iteration_s": _cpu_per_iteration(rounds),
                          "epoch_train_s": [statistics.median(r["epochs"][e]["train_s"]
                                                              for r in rounds)
                                            for e in range(epochs)]}
    return out


def _cpu_per_iteration(rounds: list[dict[str, Any]]) -> float | None:
    """Median over rounds of rank 0's process CPU time per training step (None for runs
    that did not record it)."""
    per_round = [sum(e["cpu_s"] for e in r["epochs"]) / sum(e["steps"] for e in r["epochs"])
                 for r in rounds if all("cpu_s" in e and e.get("steps") for e in r["epochs"])]
    return statistics.median(per_round) if per_round else None


def format_summary(summary: dict[str, dict[str, Any]], np_: int, emulate: str | None) -> str:
    where = f"emulated {emulate}" if emulate else "shared memory"
    lines = [f"K-FAC, {np_} ranks, {where}",
             f"{'framework':>14} {'ms/iter (mean)':>15} {'ms/iter (median)':>17} "
             f"{'CPU ms/iter':>12}  held-out accuracy per epoch"]
    for framework, row in summary.items():
        acc = " ".join(f"{a:.4f}" for a in row["accuracy"])
        cpu = row.get("cpu_per_iteration_s")
        cpu_text = "-" if cpu is None else f"{1e3 * cpu:.1f}"
        lines.append(f"{framework:>14} {1e3 * row['iteration_mean_s']:>15.1f} "
                     f"{1e3 * row['iteration_median_s']:>17.1f} {cpu_text:>12}  {acc}")
    if "kfac-pytorch" in summary and "dlcomm" in summary:
        peer, ours = summary["kfac-pytorch"], summary["dlcomm"]
        ratio = peer["iteration_mean_s"] / ours["iteration_mean_s"]
        gap = max(abs(a - b) for a, b in zip(peer["accuracy"], ours["accuracy"]))
        lines.append(f"kfac-pytorch / dlcomm time per iteration: {ratio:.2f}x; largest "
                     f"accuracy difference over the epochs: {100 * gap:.2f} points")
    return "\n".join(lines)


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench kfac``."""
    p = actions.add_parser(
        "kfac", help="distributed K-FAC: dlcomm against kfac-pytorch (DDP over gloo), time "
        "per iteration and accuracy per epoch (a driver: not under dlcommrun)",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--np", type=int, default=4, help="ranks per job (default 4)")
    p.add_argument("--emulate", default=None,
                   help="run the jobs on an emulated cluster, e.g. 4x1gbit (needs root)")
    p.add_argument("--frameworks", default="kfac-pytorch,dlcomm",
                   help="comma-separated, first round's order (default kfac-pytorch,dlcomm)")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds; the order of the frameworks alternates between rounds")
    p.add_argument("--peer-path", default=None,
                   help="directory where kfac-pytorch is installed (pip install --target); "
                   "default: importable as is")
    p.add_argument("--symmetry-aware", type=int, choices=[0, 1], default=None,
                   help="force symmetry_aware for both (default: each framework's own)")
    for flag, kind, default, text in JOB_OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per job")
    p.add_argument("--json", default=None, help="write every round and the summary here")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.np < 1 or args.repeats < 1:
        raise ValueError("--np and --repeats must be >= 1")
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if not frameworks or unknown or len(set(frameworks)) != len(frameworks):
        raise ValueError(f"--frameworks takes distinct names from {', '.join(FRAMEWORKS)}, "
                         f"got {args.frameworks!r}")
    if args.compute_method not in ("eigen", "inverse"):
        raise ValueError(f"--compute-method must be eigen or inverse, got {args.compute_method!r}")
    options = {flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace("-", "_"))
               for flag, _, _, _ in JOB_OPTIONS}
    results: dict[str, list[dict[str, Any]]] = {f: [] for f in frameworks}
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.repeats):
            order = frameworks if round_index % 2 == 0 else frameworks[::-1]
            for framework in order:
                path = Path(tmp) / f"{framework}.{round_index}.json"
                cmd = job_command(framework, args.np, args.emulate, options, path,
                                  args.peer_path, args.symmetry_aware, free_port())
                load = os.getloadavg()[0]
                result = run_job(cmd, path, args.timeout)
                result["load_before"] = load
                result["command"] = cmd
                results[framework].append(result)
                mean_ms = 1e3 * statistics.fmean(result["iteration_s"])
                acc = " ".join(f"{e['accuracy']:.4f}" for e in result["epochs"])
                print(f"round {round_index + 1}/{args.repeats} {framework:>12}: "
                      f"{mean_ms:8.1f} ms/iter, accuracy per epoch {acc} "
                      f"(load {load:.1f})", flush=True)
    summary = summarize(results)
    print(format_summary(summary, args.np, args.emulate))
    print(f"({time.time() - started:.0f} s, load average {os.getloadavg()[0]:.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rounds": results},
                                              indent=1))
    return 0
