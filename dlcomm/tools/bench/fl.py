"""``dlcomm bench fl``: dlcomm's federated simulation against Flower's, on the same task.

For each client count (default 100 and 1000, 100 clients per round) it runs, as separate
processes: the single-process FedAvg reference; one process training one client (the memory
a one-process-per-client simulator needs per client); then, alternating which goes first,
Flower's simulation (Ray actors, as many as dlcomm's ranks) and dlcomm's
(``dlcommrun -np N``). Every side trains the same MLP on the same Dirichlet split with the same
sampled clients and per-client seeds, so each final model is compared with the reference's.
Printed: median time per round (round 1, the start-up, left out), the peak summed RSS and PSS
of each side's whole process tree, the ratios, and the one-process-per-client estimate
(one client process's peak RSS times the number of clients: an estimate, not a run).

    dlcomm bench fl --np 4 --rounds 5 --repeats 3 --json fl.json

Flower comes from the ``fl-bench`` extra, usually in its own environment
(``--flower-python .venv-flwr/bin/python``; ``make bench-fl`` builds it). flwr imports
TensorFlow whenever it is installed; the bench hides it from Flower's processes (a stub on
their PYTHONPATH) so both sides load the same libraries; ``--keep-tensorflow`` does not.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

_TF_STUB = ('raise ModuleNotFoundError("tensorflow is hidden from this process by dlcomm bench '
            'fl (--keep-tensorflow keeps it)", name="tensorflow")\n')


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 100,1000, got {text!r}") \
            from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers >= 1, got {text!r}")
    return values


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench fl``."""
    # imported when the parser is built: `dlcomm` imports every bench module on each call,
    # and dlcomm.tools.bench.command imports this module
    from dlcomm.tools.bench.arguments import count_arg
    from dlcomm.tools.bench.fl_sides import add_task_arguments

    p = actions.add_parser(
        "fl", help="federated simulation: dlcomm against Flower's simulation engine",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    add_task_arguments(p, with_clients=False)
    p.add_argument("--client-counts", type=_int_list, default=[100, 1000], metavar="LIST",
                   help="numbers of clients to run (default 100,1000)")
    p.add_argument("--np", type=count_arg(1), default=4,
                   help="dlcomm ranks, and Flower's client actors (default 4)")
    p.add_argument("--repeats", type=count_arg(1), default=2,
                   help="alternating Flower/dlcomm pairs per client count (default 2)")
    p.add_argument("--flower-python", default=sys.executable, metavar="PYTHON",
                   help="the Python with flwr[simulation] installed (default this one)")
    p.add_argument("--no-flower", action="store_true", help="skip Flower's side")
    p.add_argument("--keep-tensorflow", action="store_true",
                   help="let flwr import TensorFlow in Flower's processes")
    p.add_argument("--timeout", type=count_arg(1), default=3600,
                   help="seconds each side may run (default 3600)")
    p.add_argument("--workdir", default=None, help="where the sides' results and logs go "
                   "(default a temporary directory, removed afterwards)")
    p.add_argument("--json", default=None, metavar="PATH", help="write every result here")
    p.set_defaults(func=main)


def run_side(cmd: list[str], log: Path, timeout: float,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one side to completion in its own session, sampling its process tree's memory."""
    from dlcomm.tools.bench.machine import load_average  # handlers import what they use (above)
    from dlcomm.tools.bench.process_memory import TreeMemorySampler

    load = load_average()
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        with TreeMemorySampler(proc.pid) as sampler:
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                raise RuntimeError(f"{cmd[0]} ... ran past {timeout} s; see {log}") from None
    if rc != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"side {' '.join(cmd[:6])} ... exited {rc}; end of {log}:\n{tail}")
    return {"wall_seconds": time.perf_counter() - start, "peak_rss_bytes": sampler.peak_rss,
            "peak_pss_bytes": sampler.peak_pss, "processes": sampler.peak_count,
            "load_average_before": load}


def max_abs_diff(a_path: str, b_path: str) -> float:
    with np.load(a_path) as a, np.load(b_path) as b:
        if sorted(a.files) != sorted(b.files):
            return float("inf")
        return max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a.files)


def _dlcommrun() -> list[str]:
    found = shutil.which("dlcommrun")
    return [found] if found else [sys.executable, "-m", "dlcomm.launcher.dlcommrun"]


def run_count(args: argparse.Namespace, clients: int, work: Path,
              flower_env: dict[str, str]) -> dict[str, Any]:
    """Every side at one client count; returns their results and the comparison."""
    from dlcomm.tools.bench.fl_sides import task_arguments  # as above

    args.clients = clients
    per_round = min(args.clients_per_round, clients)
    saved = args.clients_per_round
    args.clients_per_round = per_round
    task = task_arguments(args)
    args.clients_per_round = saved
    threads = max(1, (os.cpu_count() or 1) // args.np)
    side = [sys.executable, "-m", "dlcomm.tools.bench.fl_sides"]
    tag = f"c{clients}"
    out: dict[str, Any] = {"clients": clients, "clients_per_round": per_round,
                           "rounds": args.rounds, "runs": []}

    def one(name: str, cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        path = work / f"{tag}_{name}_{len(out['runs'])}.json"
        print(f"  {clients} clients: {name} ...", flush=True)
        measured = run_side(cmd + ["--json", str(path)], path.with_suffix(".log"),
                            args.timeout, env)
        result = {**json.loads(path.read_text()), **measured, "json": str(path)}
        out["runs"].append(result)
        return result

    ref = one("reference", side + ["reference", *task, "--threads", str(threads)])
    one_client = one("one-client", side + ["one-client", *task, "--threads", str(threads)])
    out["one_process_per_client_estimate_bytes"] = one_client["peak_rss_bytes"] * clients
    for repeat in range(args.repeats):
        order = ["flower", "dlcomm"] if repeat % 2 == 0 else ["dlcomm", "flower"]
        for name in order:
            if name == "flower" and args.no_flower:
                continue
            if name == "flower":
                r = one("flower", [args.flower_python, "-m", "dlcomm.tools.bench.fl_sides",
                                   "flower", *task, "--actors", str(args.np), "--threads",
                                   str(threads)], flower_env)
            else:
                r = one("dlcomm", _dlcommrun() + ["-np", str(args.np)] + side
                        + ["dlcomm", *task])
            r["max_abs_diff_to_reference"] = max_abs_diff(r["json"] + ".npz",
                                                          ref["json"] + ".npz")
    return out


def summarise(count: dict[str, Any]) -> dict[str, Any]:
    """Medians over the repeats and the dlcomm/Flower ratios of one client count."""
    by = {name: [r for r in count["runs"] if r["side"] == name] for name in ("dlcomm",
                                                                             "flower")}
    s: dict[str, Any] = {"clients": count["clients"]}
    for name, runs in by.items():
        if runs:
            s[name] = {
                "median_round_seconds": statistics.median(r["median_round_seconds"]
                                                          for r in runs),
                "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
                "peak_pss_bytes": max(r["peak_pss_bytes"] for r in runs),
                "max_abs_diff_to_reference": max(r["max_abs_diff_to_reference"] for r in runs),
                "accuracy": [r["accuracy"] for r in runs]}
    s["one_process_per_client_estimate_bytes"] = count["one_process_per_client_estimate_bytes"]
    if "dlcomm" in s:
        d = s["dlcomm"]
        s["estimate_over_dlcomm_rss"] = s["one_process_per_client_estimate_bytes"] / \
            d["peak_rss_bytes"]
        if "flower" in s:
            f = s["flower"]
            s["flower_over_dlcomm_round_time"] = f["median_round_seconds"] / \
                d["median_round_seconds"]
            s["flower_over_dlcomm_rss"] = f["peak_rss_bytes"] / d["peak_rss_bytes"]
            s["flower_over_dlcomm_pss"] = f["peak_pss_bytes"] / d["peak_pss_bytes"]
    return s


def table(summaries: list[dict[str, Any]]) -> str:
    mib = 1 << 20
    lines = ["| clients | side | s per round (median) | peak RSS, MiB | peak PSS, MiB | "
             "max abs diff to reference |", "|---:|---|---:|---:|---:|---:|"]
    for s in summaries:
        for name in ("dlcomm", "flower"):
            if name in s:
                r = s[name]
                lines.append(f"| {s['clients']} | {name} | {r['median_round_seconds']:.3f} | "
                             f"{r['peak_rss_bytes'] / mib:.0f} | {r['peak_pss_bytes'] / mib:.0f}"
                             f" | {r['max_abs_diff_to_reference']:.2e} |")
        lines.append(f"| {s['clients']} | one process per client (estimate: one client "
                     f"process x {s['clients']}) | | "
                     f"{s['one_process_per_client_estimate_bytes'] / mib:.0f} | | |")
    lines.append("")
    for s in summaries:
        parts = []
        if "flower_over_dlcomm_round_time" in s:
            parts.append(f"Flower/dlcomm time per round {s['flower_over_dlcomm_round_time']:.2f}x"
                         f", peak RSS {s['flower_over_dlcomm_rss']:.2f}x, peak PSS "
                         f"{s['flower_over_dlcomm_pss']:.2f}x")
        if "estimate_over_dlcomm_rss" in s:
            parts.append(f"one-process-per-client estimate / dlcomm peak RSS "
                         f"{s['estimate_over_dlcomm_rss']:.1f}x")
        lines.append(f"- {s['clients']} clients: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    from dlcomm.tools.bench.machine import describe_machine, format_machine  # as above

    work = Path(args.workdir or tempfile.mkdtemp(prefix="dlcomm-bench-fl-"))
    work.mkdir(parents=True, exist_ok=True)
    flower_env = dict(os.environ)
    if not args.keep_tensorflow:
        stub = work / "hide_tensorflow" / "tensorflow"
        stub.mkdir(parents=True, exist_ok=True)
        (stub / "__init__.py").write_text(_TF_STUB)
        flower_env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(stub.parent), flower_env.get("PYTHONPATH", "")] if p)
    machine = describe_machine()
    print(f"dlcomm bench fl: {args.np} ranks / Flower actors, {args.rounds} rounds, "
          f"{args.repeats} alternating pairs; {format_machine(machine)}", flush=True)
    counts = []
    try:
        for clients in args.client_counts:
            counts.append(run_count(args, clients, work, flower_env))
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    summaries = [summarise(c) for c in counts]
    print(table(summaries), end="", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "argv": sys.argv, "counts": counts,
                       "summaries": summaries}, f, indent=1, default=str)
    return 0
