"""``dlcomm bench train``: training throughput of the torch adapter against torch DDP, for a
list of configurations (dense, each compressor, each schedule) in one run, with scaling
efficiency against one rank.

Unlike the collective benchmarks this is a driver, not run under ``dlcommrun``: for every
configuration it starts ``examples/torch_synthetic_benchmark.py`` through dlcomm and through
torch ``DistributedDataParallel`` (gloo; ``fp16_compress_hook`` for ``fp16``,
``powerSGD_hook`` for ``powersgd:rank=R``, see ``ddp_peer``) on ``--np`` ranks, optionally on
an emulated cluster, and through dlcomm on one rank. The same model, initial weights,
per-rank batches, learning rate and momentum go through both, in separate jobs that alternate
round by round (``--repeats N``: dlcomm first in odd rounds, DDP first in even ones), and
each row reports the medians, dlcomm's speed over DDP's, and whether both reached the same
final loss.

    dlcomm bench train --np 4 --configs none,fp16 --repeats 3
    dlcomm bench train --np 4 --emulate 4x1gbit --configs "none;fp16;powersgd:rank=4" --repeats 3
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dlcomm.tools.bench.ddp_peer import ddp_hook_name

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torch_synthetic_benchmark.py"
PEERS = ("ddp",)
# dlcommrun's message when another job holds the machine's one emulated cluster: wait for it.
EMULATION_BUSY = "another emulated cluster is running"
EMULATION_BUSY_RETRIES = 40
EMULATION_BUSY_WAIT_S = 8.0
# How close dlcomm's final loss (mean over ranks) must be to DDP's: (relative, absolute).
# Dense training computes the same sums up to rounding; fp16 rounds differently (DDP's hook
# divides before the sum); PowerSGD's first steps differ (DDP runs two uncompressed steps
# and draws its own random start), so only reaching a similar loss is checked there.
LOSS_TOLERANCE = {"none": (1e-3, 1e-6), "fp16": (2e-2, 1e-3), "powersgd": (0.5, 0.05)}


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """What every job of one run shares (the example's options)."""

    model: str = "mlp"
    batch_size: int = 32
    iters: int = 5  # timed iterations (the example's --num-iters)
    batches_per_iter: int = 5
    warmup: int = 5  # untimed steps first
    lr: float = 0.01  # per rank, scaled by the rank count
    momentum: float = 0.9
    emulate: str | None = None  # emulated cluster of the multi-rank jobs
    slots_per_host: int = 1  # ranks per emulated host

    def example_args(self) -> list[str]:
        return ["--model", self.model, "--batch-size", str(self.batch_size),
                "--num-iters", str(self.iters), "--num-batches-per-iter",
                str(self.batches_per_iter), "--num-warmup-batches", str(self.warmup),
                "--lr", repr(self.lr), "--momentum", repr(self.momentum)]


def parse_list(text: str) -> list[str]:
    """Split a list of specs (or names): see ``split_spec_list``."""
    from dlcomm.compression.registry import split_spec_list

    return split_spec_list(text)


def job_command(framework: str, np_: int, compression: str, schedule: str,
                settings: TrainSettings, json_path: str) -> list[str]:
    """The ``dlcommrun`` command of one job of the synthetic benchmark."""
    cmd = ["dlcommrun", "-np", str(np_)]
    if settings.emulate and np_ > 1:
        cmd += ["--emulate", settings.emulate]
        if settings.slots_per_host > 1:
            cmd += ["--slots-per-host", str(settings.slots_per_host)]
    cmd += [sys.executable, str(EXAMPLE), "--framework", framework, *settings.example_args(),
            "--compression", compression, "--json", json_path]
    if framework == "dlcomm":
        cmd += ["--schedule", schedule]
    return cmd


def run_config(framework: str, np_: int, compression: str, schedule: str,
               settings: TrainSettings, timeout: float = 1800) -> dict[str, Any]:
    """One job of the synthetic benchmark; returns its JSON result (rank 0's)."""
    if not EXAMPLE.exists():
        raise FileNotFoundError(f"{EXAMPLE} not found: run from a dlcomm source checkout")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = job_command(framework, np_, compression, schedule, settings, str(out))
        for _attempt in range(EMULATION_BUSY_RETRIES):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  env=dict(os.environ))
            if EMULATION_BUSY not in proc.stderr:
                break
            time.sleep(EMULATION_BUSY_WAIT_S)  # another job holds the emulated cluster
        if not out.exists() or (proc.returncode != 0 and framework != "ddp"):
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                               f"{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
        result = json.loads(out.read_text())[0]
        if proc.returncode != 0:
            # torch's gloo process group sometimes aborts in its own teardown, after every
            # rank finished and rank 0 wrote the figures: keep them, and say so.
            result["exit_code_after_results"] = proc.returncode
            print(f"note: the ddp job exited {proc.returncode} after writing its results "
                  f"(torch gloo teardown); its figures are kept", file=sys.stderr, flush=True)
    result["schedule"] = schedule if framework == "dlcomm" else None
    return result


def same_loss(compression: str, ours: float, peer: float) -> bool:
    """True when the two final losses agree within ``compression``'s tolerance."""
    name = compression.partition(":")[0].partition("+")[0].strip().lower()
    rtol, atol = LOSS_TOLERANCE.get(name, LOSS_TOLERANCE["powersgd"])
    if not (math.isfinite(ours) and math.isfinite(peer)):
        return False
    return abs(ours - peer) <= rtol * max(abs(ours), abs(peer)) + atol


def measure(np_: int, configs: list[str], schedules: list[str], settings: TrainSettings,
            repeats: int = 1, peers: tuple[str, ...] = PEERS,
            scaling: bool = True) -> list[dict[str, Any]]:
    """Every (compression, schedule) on ``np_`` ranks through dlcomm, each compression through
    every peer that has a counterpart (DDP's hooks), and through dlcomm on one rank.

    The multi-rank jobs run in rounds, every job once per round in the same order, so slow
    drifts of the machine hit all of them alike; the frameworks swap places every round. A
    row reports the median round of each framework (every round's figure in ``rounds``),
    the ratio of the medians (``dlcomm_over_<peer>``: dlcomm's samples/s over the peer's,
    above 1 is dlcomm faster) and the median of the per-round ratios (``..._paired``).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise ValueError(f"unknown peer(s) {unknown}; valid: {', '.join(PEERS)}")
    pairs = [(c, s) for c in configs for s in schedules]
    with_peer = {c: [p for p in peers if ddp_hook_name(c) is not None] for c in configs}
    single = ({pair: run_config("dlcomm", 1, *pair, settings) for pair in pairs}
              if scaling else {})
    ours: dict[tuple[str, str], list[dict[str, Any]]] = {pair: [] for pair in pairs}
    theirs: dict[tuple[str, str], list[dict[str, Any]]] = {
        (c, p): [] for c in configs for p in with_peer[c]}
    for round_index in range(repeats):
        for compression in configs:
            jobs = [("dlcomm", s) for s in schedules] + [(p, "") for p in with_peer[compression]]
            if round_index % 2:
                jobs.reverse()
            for framework, schedule in jobs:
                result = run_config(framework, np_, compression, schedule or "wfbp", settings)
                if framework == "dlcomm":
                    ours[(compression, schedule)].append(result)
                else:
                    theirs[(compression, framework)].append(result)
                label = f"{framework} {schedule}".strip()
                print(f"{compression:>24} {label:>14} round {round_index + 1}/{repeats}: "
                      f"{result['total_samples_per_s']:8.1f} samples/s on {np_} ranks, "
                      f"final loss {result['final_loss']:.6f}", flush=True)
    rows = []
    for compression, schedule in pairs:
        runs = ours[(compression, schedule)]
        totals = [r["total_samples_per_s"] for r in runs]
        total = statistics.median(totals)
        row: dict[str, Any] = {
            "compression": compression, "schedule": schedule, "model": settings.model,
            "ranks": np_, "emulate": settings.emulate or "",
            "slots_per_host": settings.slots_per_host if settings.emulate else 1,
            "batch_size": settings.batch_size,
            "steps": runs[-1]["steps"], "lr": runs[-1]["lr"], "momentum": runs[-1]["momentum"],
            "total_samples_per_s": total, "per_rank_samples_per_s": total / np_,
            "ms_per_iteration": 1e3 * settings.batch_size * np_ / total,
            "rounds": totals, "final_loss": runs[-1]["final_loss"], "peers": {},
            # per round: rank 0's iteration times, CPU time per iteration (rank means)
            "iteration_ms": [r.get("iteration_ms") for r in runs],
            "cpu_ms_per_iteration": [r.get("cpu_ms_per_iteration") for r in runs],
        }
        if scaling:
            one = single[(compression, schedule)]["per_rank_samples_per_s"]
            row["one_rank_samples_per_s"] = one
            row["scaling_efficiency"] = total / (one * np_)
        for peer in with_peer[compression]:
            peer_runs = theirs[(compression, peer)]
            peer_totals = [r["total_samples_per_s"] for r in peer_runs]
            peer_total = statistics.median(peer_totals)
            loss = peer_runs[-1]["final_loss"]
            row["peers"][peer] = {
                "hook": ddp_hook_name(compression), "total_samples_per_s": peer_total,
                "ms_per_iteration": 1e3 * settings.batch_size * np_ / peer_total,
                "rounds": peer_totals, "final_loss": loss,
                "iteration_ms": [r.get("iteration_ms") for r in peer_runs],
                "cpu_ms_per_iteration": [r.get("cpu_ms_per_iteration") for r in peer_runs],
                "dlcomm_over_peer": total / peer_total,
                "dlcomm_over_peer_paired": statistics.median(
                    a / b for a, b in zip(totals, peer_totals)),
                "same_loss": same_loss(compression, row["final_loss"], loss),
            }
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The results as a Markdown table: dlcomm, DDP, their ratio, the losses, scaling."""
    base = rows[0]["total_samples_per_s"]
    spread = any(len(r.get("rounds", [])) > 1 for r in rows)
    scaling = all("scaling_efficiency" in r for r in rows)
    head = ["compression", "schedule", "dlcomm ms/iter", "dlcomm samples/s", "DDP peer",
            "DDP ms/iter", "dlcomm / DDP speed (paired)", "final loss dlcomm / DDP"]
    if scaling:
        head += ["1 rank (samples/s)", "scaling efficiency"]
    head.append("vs first row")
    if spread:
        head.append("rounds dlcomm / DDP (samples/s)")
    lines = ["| " + " | ".join(head) + " |",
             "|---|---|" + "---:|" * 2 + "---|" + "---:|" * 2 + "---|"
             + ("---:|" * 2 if scaling else "") + "---:|" + ("---|" if spread else "")]
    for r in rows:
        ddp = r.get("peers", {}).get("ddp")
        cells = [f"`{r['compression']}`", r["schedule"],
                 f"{1e3 * r['batch_size'] * r['ranks'] / r['total_samples_per_s']:.0f}",
                 f"{r['total_samples_per_s']:.1f}"]
        if ddp is None:
            cells += ["none", "-", "-", f"{r['final_loss']:.4g} / -"]
        else:
            check = "" if ddp["same_loss"] else " (DIFFERENT)"
            cells += [f"`{ddp['hook']}`", f"{ddp['ms_per_iteration']:.0f}",
                      f"{ddp['dlcomm_over_peer']:.2f}x ({ddp['dlcomm_over_peer_paired']:.2f}x)",
                      f"{r['final_loss']:.4g} / {ddp['final_loss']:.4g}{check}"]
        if scaling:
            cells += [f"{r['one_rank_samples_per_s']:.1f}", f"{r['scaling_efficiency']:.2f}"]
        cells.append(f"{r['total_samples_per_s'] / base:.2f}x")
        if spread:
            ours = ", ".join(f"{t:.0f}" for t in r["rounds"])
            peer = ", ".join(f"{t:.0f}" for t in ddp["rounds"]) if ddp else "-"
            cells.append(f"{ours} / {peer}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """A bar chart of total samples/s per configuration, DDP's beside dlcomm's."""
    import matplotlib  # noqa: PLC0415 - optional dependency (the bench extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - optional dependency (the bench extra)

    labels = [f"{r['compression']}\n{r['schedule']}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(rows)), 3.5))
    ax.bar([i - 0.2 for i in x], [r["total_samples_per_s"] for r in rows], 0.4,
           label="dlcomm")
    ax.bar([i + 0.2 for i in x], [r.get("peers", {}).get("ddp", {}).get(
        "total_samples_per_s", 0.0) for r in rows], 0.4, label="torch DDP")
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("samples/s (all ranks)")
    ax.legend(fontsize=8)
    where = f", emulated {rows[0]['emulate']}" if rows[0]["emulate"] else ""
    ax.set_title(f"{rows[0]['model']} on {rows[0]['ranks']} ranks{where}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench train``."""
    p = actions.add_parser("train", help="training throughput per configuration against "
                           "torch DDP, with scaling efficiency against one rank (a driver: "
                           "not under dlcommrun)")
    p.add_argument("--np", type=int, default=4, help="ranks of the multi-rank runs")
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "tiny"])
    p.add_argument("--configs", default="none,fp16",
                   help="compressions separated by ',' (a spec's own parameters stay "
                        "with it) or by ';' (default none,fp16)")
    p.add_argument("--schedules", default="wfbp", help="comma-separated: wfbp, mgwfbp, "
                   "dear, none")
    p.add_argument("--peers", default="ddp", help="'ddp' (torch DDP over gloo with the "
                   "matching hook) or 'none'")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iters", type=int, default=5, help="timed iterations per job")
    p.add_argument("--batches-per-iter", type=int, default=5, help="steps per timed iteration")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per job")
    p.add_argument("--lr", type=float, default=0.01, help="per rank (scaled by ranks)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--repeats", type=int, default=1, help="rounds of the multi-rank jobs, "
                   "every job once per round; rows report the median round")
    p.add_argument("--no-scaling", action="store_true",
                   help="skip the one-rank jobs (no scaling efficiency)")
    p.add_argument("--emulate", default=None, help="run the multi-rank jobs on an emulated "
                   "cluster, e.g. 4x1gbit (needs root)")
    p.add_argument("--slots-per-host", type=int, default=1,
                   help="ranks per emulated host (dlcommrun's option; with --emulate)")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, help="bar chart PNG")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.np < 1:
        raise SystemExit("--np must be >= 1")
    for name in ("repeats", "iters", "batches_per_iter", "batch_size", "slots_per_host"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        raise SystemExit("--warmup must be >= 0")
    peers = () if args.peers.strip().lower() == "none" else tuple(parse_list(args.peers))
    if set(peers) - set(PEERS):
        raise SystemExit(f"--peers: unknown {sorted(set(peers) - set(PEERS))}; valid: ddp, none")
    settings = TrainSettings(args.model, args.batch_size, args.iters, args.batches_per_iter,
                             args.warmup, args.lr, args.momentum, args.emulate,
                             args.slots_per_host)
    start = time.time()
    rows = measure(args.np, parse_list(args.configs), parse_list(args.schedules), settings,
                   args.repeats, peers, scaling=not args.no_scaling)
    print(markdown_table(rows))
    print(f"({time.time() - start:.0f} s, load average {os.getloadavg()[0]:.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot(rows, args.plot)
    return 1 if any(not p["same_loss"] for r in rows for p in r["peers"].values()) else 0
