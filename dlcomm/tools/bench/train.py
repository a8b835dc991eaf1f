"""``dlcomm bench train``: training throughput of the torch adapter for a list of
configurations (dense, each compressor, each schedule) in one run, with scaling efficiency
against one rank.

Unlike the collective benchmarks this is a driver, not run under ``dlcommrun``: for every
configuration it starts ``examples/torch_synthetic_benchmark.py`` on one rank and on ``--np``
ranks (optionally on an emulated cluster) and compares them.

    dlcomm bench train --np 4 --configs none,fp16,powersgd:rank=4 --schedules wfbp
    dlcomm bench train --np 4 --emulate 4x1gbit --configs none,acpsgd:rank=4 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torch_synthetic_benchmark.py"


def parse_list(text: str) -> list[str]:
    """Split a ';'-separated list, or a ','-separated one when no spec has parameters."""
    items = text.split(";") if ";" in text else text.split(",")
    out = [i.strip() for i in items if i.strip()]
    if not out:
        raise ValueError(f"empty list: {text!r}")
    return out


def run_config(np_: int, model: str, compression: str, schedule: str, batch_size: int,
               iters: int, emulate: str | None = None, timeout: float = 1800) -> dict[str, Any]:
    """One job of the synthetic benchmark; returns its JSON result (rank 0's)."""
    if not EXAMPLE.exists():
        raise FileNotFoundError(f"{EXAMPLE} not found: run from a dlcomm source checkout")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = ["dlcommrun", "-np", str(np_)]
        if emulate and np_ > 1:
            cmd += ["--emulate", emulate]
        cmd += [sys.executable, str(EXAMPLE), "--model", model, "--compression", compression,
                "--schedule", schedule, "--batch-size", str(batch_size), "--num-iters",
                str(iters), "--json", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ))
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                               f"{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
        result = json.loads(out.read_text())[0]
    result["schedule"] = schedule
    return result


def measure(np_: int, model: str, configs: list[str], schedules: list[str], batch_size: int,
            iters: int, emulate: str | None = None, repeats: int = 1) -> list[dict[str, Any]]:
    """Every (compression, schedule) on one rank and on ``np_`` ranks.

    With ``repeats`` > 1 the multi-rank jobs run in rounds, every configuration once per
    round in the same order, so slow drifts of the machine hit all of them alike; a row
    reports the median round (and every round's figure in ``rounds``).
    """
    pairs = [(c, s) for c in configs for s in schedules]
    single = {pair: run_config(1, model, *pair, batch_size, iters) for pair in pairs}
    rounds: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    for round_index in range(repeats):
        for compression, schedule in pairs:
            multi = run_config(np_, model, compression, schedule, batch_size, iters, emulate)
            rounds[(compression, schedule)].append(multi["total_samples_per_s"])
            print(f"{compression:>24} {schedule:>7} round {round_index + 1}/{repeats}: "
                  f"{multi['total_samples_per_s']:8.1f} samples/s on {np_} ranks", flush=True)
    rows = []
    for compression, schedule in pairs:
        totals = rounds[(compression, schedule)]
        total = statistics.median(totals)
        one = single[(compression, schedule)]["per_rank_samples_per_s"]
        rows.append({
            "compression": compression, "schedule": schedule, "model": model,
            "ranks": np_, "emulate": emulate or "", "batch_size": batch_size,
            "one_rank_samples_per_s": one,
            "total_samples_per_s": total,
            "per_rank_samples_per_s": total / np_,
            "rounds": totals,
            "scaling_efficiency": total / (one * np_),
        })
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The results as a Markdown table, with each row's speed relative to the first."""
    base = rows[0]["total_samples_per_s"]
    spread = any(len(r.get("rounds", [])) > 1 for r in rows)
    lines = ["| compression | schedule | 1 rank (samples/s) | N ranks total (samples/s) | "
             "ms per iteration | scaling efficiency | vs first row |"
             + (" rounds (samples/s) |" if spread else ""),
             "|---|---|---:|---:|---:|---:|---:|" + ("---|" if spread else "")]
    for r in rows:
        ms = 1e3 * r["batch_size"] * r["ranks"] / r["total_samples_per_s"]
        lines.append(f"| `{r['compression']}` | {r['schedule']} | "
                     f"{r['one_rank_samples_per_s']:.1f} | {r['total_samples_per_s']:.1f} | "
                     f"{ms:.0f} | {r['scaling_efficiency']:.2f} | "
                     f"{r['total_samples_per_s'] / base:.2f}x |"
                     + (" " + ", ".join(f"{t:.0f}" for t in r["rounds"]) + " |"
                        if spread else ""))
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """A bar chart of total samples/s per configuration."""
    import matplotlib  # noqa: PLC0415 - optional dependency (the bench extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - optional dependency (the bench extra)

    labels = [f"{r['compression']}\n{r['schedule']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rows)), 3.5))
    ax.bar(range(len(rows)), [r["total_samples_per_s"] for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("samples/s (all ranks)")
    where = f", emulated {rows[0]['emulate']}" if rows[0]["emulate"] else ""
    ax.set_title(f"{rows[0]['model']} on {rows[0]['ranks']} ranks{where}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench train``."""
    p = actions.add_parser("train", help="training throughput per configuration, with "
                           "scaling efficiency against one rank (a driver: not under dlcommrun)")
    p.add_argument("--np", type=int, default=4, help="ranks of the multi-rank runs")
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--configs", default="none,fp16",
                   help="compressions; separate with ';' when a spec has ',' (default "
                        "none,fp16)")
    p.add_argument("--schedules", default="wfbp", help="comma-separated: wfbp, mgwfbp, "
                   "dear, none")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iters", type=int, default=5, help="timed iterations per job")
    p.add_argument("--repeats", type=int, default=1, help="rounds of the multi-rank jobs, "
                   "every configuration once per round; rows report the median round")
    p.add_argument("--emulate", default=None, help="run the multi-rank jobs on an emulated "
                   "cluster, e.g. 4x1gbit (needs root)")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, help="bar chart PNG")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.np < 1:
        raise SystemExit("--np must be >= 1")
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    start = time.time()
    rows = measure(args.np, args.model, parse_list(args.configs), parse_list(args.schedules),
                   args.batch_size, args.iters, args.emulate, args.repeats)
    print(markdown_table(rows))
    print(f"({time.time() - start:.0f} s, load average {os.getloadavg()[0]:.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot(rows, args.plot)
    return 0
