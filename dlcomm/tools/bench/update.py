"""``dlcomm bench update``: the optimizer's update of every parameter, per tensor against
torch's multi-tensor ``foreach`` and ``fused`` paths (what ``DLCOMM_FUSED_UPDATE`` picks).

One process, no communication: the update is local work that follows every all-reduce. Each
model's gradients are random and fixed; one round runs ``--steps`` steps of each
implementation, in an order that rotates from round to round, and the figure is the median
time per step over all rounds. Ratios are the per-tensor time over each path's.

    dlcomm bench update --models mlp,deep --optimizers sgd,adam --rounds 7
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from dlcomm.tools.bench.arguments import count_arg

IMPLEMENTATIONS = ("per-tensor", "foreach", "fused")


def build_model(name: str) -> Any:
    """``mlp``: the training benchmarks' 6.3M-parameter MLP (6 tensors, 25 MB); ``deep``: 48
    residual-sized blocks of Linear(256, 256) + LayerNorm (192 tensors, 12.7 MB), where the
    per-tensor overhead of the loop shows."""
    import torch  # noqa: PLC0415 - the torch extra, needed here only

    if name == "mlp":
        return torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 1536), torch.nn.ReLU(),
            torch.nn.Linear(1536, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    if name == "deep":
        layers = []
        for _ in range(48):
            layers += [torch.nn.Linear(256, 256), torch.nn.LayerNorm(256)]
        return torch.nn.Sequential(*layers)
    raise ValueError(f"unknown model {name!r}; valid: mlp, deep")


def make_optimizer(name: str, params: list, implementation: str) -> Any:
    """``sgd`` (momentum 0.9, weight decay 1e-4) or ``adam``, stepping as ``implementation``."""
    import torch  # noqa: PLC0415

    options = {"per-tensor": {"foreach": False}, "foreach": {"foreach": True},
               "fused": {"fused": True}}[implementation]
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4, **options)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, **options)
    raise ValueError(f"unknown optimizer {name!r}; valid: sgd, adam")


def measure(model_name: str, optimizer_name: str, rounds: int, steps: int,
            warmup: int) -> dict[str, Any]:
    """Median seconds per step of each implementation, over ``rounds`` rotating rounds."""
    import torch  # noqa: PLC0415

    torch.manual_seed(0)
    model = build_model(model_name)
    params = [p for p in model.parameters()]
    grads = [torch.randn_like(p) for p in params]
    copies = {impl: [p.detach().clone().requires_grad_(True) for p in params]
              for impl in IMPLEMENTATIONS}
    optimizers = {}
    for impl, ps in copies.items():
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        optimizers[impl] = make_optimizer(optimizer_name, ps, impl)
        for _ in range(warmup):
            optimizers[impl].step()
    times: dict[str, list[float]] = {impl: [] for impl in IMPLEMENTATIONS}
    for r in range(rounds):
        order = IMPLEMENTATIONS[r % 3:] + IMPLEMENTATIONS[:r % 3]
        for impl in order:
            opt = optimizers[impl]
            start = time.perf_counter()
            for _ in range(steps):
                opt.step()
            times[impl].append((time.perf_counter() - start) / steps)
    medians = {impl: statistics.median(t) for impl, t in times.items()}
    return {"model": model_name, "optimizer": optimizer_name, "tensors": len(params),
            "parameters": sum(p.numel() for p in params),
            "seconds_per_step": medians, "all_seconds": times,
            "speedup_over_per_tensor": {impl: medians["per-tensor"] / medians[impl]
                                        for impl in IMPLEMENTATIONS}}


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | tensors | optimizer | per-tensor ms | foreach ms | fused ms | "
             "per-tensor / foreach | per-tensor / fused |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ms = {k: v * 1e3 for k, v in row["seconds_per_step"].items()}
        ratio = row["speedup_over_per_tensor"]
        lines.append(f"| {row['model']} | {row['tensors']} | {row['optimizer']} | "
                     f"{ms['per-tensor']:.2f} | {ms['foreach']:.2f} | {ms['fused']:.2f} | "
                     f"{ratio['foreach']:.2f}x | {ratio['fused']:.2f}x |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    rows = [measure(m, o, args.rounds, args.steps, args.warmup)
            for m in args.models for o in args.optimizers]
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.rounds} "
          f"rounds x {args.steps} steps")
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "steps": args.steps,
                       "rows": rows}, f, indent=1)
    return 0


def _names(valid: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        names = [t.strip() for t in text.split(",") if t.strip()]
        unknown = sorted(set(names) - set(valid))
        if not names or unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown or 'empty list'}; valid: "
                                             f"{', '.join(valid)}")
        return names
    return parse


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench update``."""
    p = actions.add_parser(
        "update", help="the optimizer update per tensor against torch's foreach and fused "
        "paths (one process)", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=_names(("mlp", "deep")), default=["mlp", "deep"],
                   help="comma-separated: mlp, deep (default both)")
    p.add_argument("--optimizers", type=_names(("sgd", "adam")), default=["sgd", "adam"],
                   help="comma-separated: sgd, adam (default both)")
    p.add_argument("--rounds", type=count_arg(1), default=7)
    p.add_argument("--steps", type=count_arg(1), default=10, help="steps per round")
    p.add_argument("--warmup", type=count_arg(0), default=3)
    p.add_argument("--threads", type=count_arg(1), default=1,
                   help="torch intra-op threads (default 1: one rank's share of this machine)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.set_defaults(func=main)
