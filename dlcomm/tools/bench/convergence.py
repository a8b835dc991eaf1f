"""Convergence of each compressor on real data: held-out accuracy and bytes per step against
dense training, same seeds and epochs, one ``dlcommrun`` job per compressor.

    python -m dlcomm.tools.bench.convergence --np 4 --epochs 5 \
        --output docs/compression_convergence.md

With ``--emulate 4x1gbit`` the jobs run on the emulated cluster and the table adds time per
step and the training time until held-out accuracy first reaches ``--target`` (evaluated
after each epoch; evaluation time excluded).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torch_mnist.py"
DEFAULT_SPECS = ["none", "fp16", "bf16", "randomk:ratio=0.05", "topk:ratio=0.01",
                 "topk:ratio=0.01,approx=1", "gtopk:ratio=0.01", "efsignsgd", "signum",
                 "qsgd:levels=16", "powersgd:rank=4", "acpsgd:rank=4"]


def run_one(spec: str, np_: int, epochs: int, dataset: str, *, emulate: str | None = None,
            model: str = "cnn", slots_per_host: int = 1) -> dict:
    """Train the demo with ``spec`` on ``np_`` ranks; return its JSON summary."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        launcher = ["dlcommrun", "-np", str(np_)] + (["--emulate", emulate] if emulate else [])
        if emulate and slots_per_host > 1:
            launcher += ["--slots-per-host", str(slots_per_host)]
        options = ["--epochs", str(epochs), "--dataset", dataset, "--model", model,
                   "--no-progress", "--compression", spec]
        cmd = [*launcher, sys.executable, str(EXAMPLE), *options, "--json", str(out)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                              env=dict(os.environ))
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{spec}: job failed ({proc.returncode})\n{proc.stderr[-2000:]}")
        result = json.loads(out.read_text())
        result["wall_s"] = time.perf_counter() - start
        result["command"] = " ".join([*launcher, "python", "examples/torch_mnist.py", *options])
        return result


def time_to_target(result: dict, target: float) -> float | None:
    """Training seconds until held-out accuracy first reached ``target`` (None: never)."""
    elapsed = 0.0
    for seconds, accuracy in zip(result["epoch_seconds"], result["epoch_accuracy"],
                                 strict=True):
        elapsed += seconds
        if accuracy >= target:
            return elapsed
    return None


def timed_table(results: list[dict], target: float) -> str:
    """Time per step and time to ``target`` accuracy against dense, one row per compressor."""
    dense = next((r for r in results if r["compression"] == "none"), results[0])
    dense_tt = time_to_target(dense, target)
    rows = [f"| compression | ms per step | step vs dense | accuracy per epoch | "
            f"s to {target:.2f} | vs dense |", "|---|---:|---:|---|---:|---:|"]
    for r in results:
        tt = time_to_target(r, target)
        speed = (f"{dense_tt / tt:.2f}x" if tt and dense_tt else "-")
        rows.append(
            f"| `{r['compression']}` | {1e3 * r['step_seconds']:.0f} | "
            f"{dense['step_seconds'] / r['step_seconds']:.2f}x | "
            + " / ".join(f"{a:.3f}" for a in r["epoch_accuracy"])
            + f" | {'not reached' if tt is None else f'{tt:.1f}'} | {speed} |")
    return "\n".join(rows) + "\n"


def table(results: list[dict]) -> str:
    dense = next((r for r in results if r["compression"] == "none"), results[0])
    rows = ["| compression | held-out accuracy | vs dense (points) | kB sent per step per rank "
            "| vs dense |", "|---|---:|---:|---:|---:|"]
    for r in results:
        rows.append(
            f"| `{r['compression']}` | {r['accuracy']:.4f} | "
            f"{100 * (r['accuracy'] - dense['accuracy']):+.2f} | "
            f"{r['bytes_per_step_per_rank'] / 1e3:.1f} | "
            f"{r['bytes_per_step_per_rank'] / dense['bytes_per_step_per_rank']:.3f}x |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--dataset", default="mnist", choices=["mnist", "digits"])
    p.add_argument("--specs", default=",".join(DEFAULT_SPECS),
                   help="compressor specs separated by ',' (a spec's own parameters stay "
                        "with it) or by ';'")
    p.add_argument("--output", default=None, help="write a Markdown section here")
    p.add_argument("--json", default=None, help="write every job's summary here")
    p.add_argument("--emulate", default=None,
                   help="run on an emulated cluster, e.g. 4x1gbit (needs root)")
    p.add_argument("--slots-per-host", type=int, default=1,
                   help="ranks per emulated host (with --emulate; default 1)")
    p.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    p.add_argument("--target", type=float, default=0.9,
                   help="held-out accuracy for the time-to-accuracy column (with --emulate)")
    args = p.parse_args(argv)
    if not 0 < args.target <= 1:
        p.error(f"--target must be in (0, 1], got {args.target}")
    if args.slots_per_host < 1:
        p.error(f"--slots-per-host must be >= 1, got {args.slots_per_host}")
    from dlcomm.compression.registry import split_spec_list

    specs = split_spec_list(args.specs)
    results = []
    for spec in specs:
        results.append(run_one(spec, args.np, args.epochs, args.dataset,
                               emulate=args.emulate, model=args.model,
                               slots_per_host=args.slots_per_host))
        r = results[-1]
        print(f"{spec:>28}: accuracy {r['accuracy']:.4f}, "
              f"{r['bytes_per_step_per_rank'] / 1e3:.1f} kB/step/rank", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    text = table(results)
    if args.emulate:
        text += "\n" + timed_table(results, args.target)
    print(text)
    if args.output:
        load = os.getloadavg()[0]
        Path(args.output).write_text(
            f"## Convergence on real data\n\nMeasured {time.strftime('%Y-%m-%d')} on "
            f"{os.cpu_count()} cores (load average {load:.1f} at the end), {args.np} ranks, "
            f"{args.dataset} (held-out 20%), {args.epochs} epochs, same seeds for every row:\n\n"
            f"    python -m dlcomm.tools.bench.convergence {' '.join(argv or sys.argv[1:])}"
            f"\n\n{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
