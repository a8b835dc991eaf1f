"""``dlcomm bench fl-schedule``: how close dlcomm.fl's scheduler comes to a perfectly balanced
round under a seeded heterogeneous trace. Arithmetic, not timing: nothing is trained.

Each client's true cost is (fixed cost + cost per sample x its samples in the bench's
Dirichlet split) / its device speed from ``ClientTrace``; each rank's true speed comes from
``rank_speeds``; every observed time carries seeded noise. Round by round, the cost model
(which never sees the truth, only the observed times of earlier rounds, as in a run) predicts,
the scheduler assigns, and the round's makespan under the true costs is compared with the
ideal (the true work spread perfectly over the true speeds). Also shown: the static split and
LPT given the true costs (an oracle).

    dlcomm bench fl-schedule --clients 1000 --clients-per-round 100 --ranks 4 --rounds 50
"""
from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import numpy as np

METHODS = ("lpt", "static", "oracle")


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench fl-schedule``."""
    # dlcomm.tools.bench.command imports this module
    from dlcomm.tools.bench.arguments import count_arg

    p = actions.add_parser(
        "fl-schedule", help="federated scheduler's makespan against the balanced ideal "
        "under a seeded heterogeneous trace (arithmetic, no training)",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--clients", type=count_arg(1), default=1000)
    p.add_argument("--clients-per-round", type=count_arg(1), default=100)
    p.add_argument("--ranks", type=count_arg(1), default=4)
    p.add_argument("--rounds", type=count_arg(1), default=50)
    p.add_argument("--warmup", type=count_arg(0), default=5,
                   help="rounds left out of the summary while the cost model learns (5)")
    p.add_argument("--dataset", choices=("mnist", "digits"), default="mnist")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--rank-sigma", type=float, default=0.3,
                   help="log-normal spread of the ranks' speeds (default 0.3)")
    p.add_argument("--client-sigma", type=float, default=0.5,
                   help="log-normal spread of the clients' device speeds (default 0.5)")
    p.add_argument("--noise", type=float, default=0.1,
                   help="log-normal spread of each observed time around its truth (0.1)")
    p.add_argument("--fixed-cost", type=float, default=2.0,
                   help="a client's fixed cost in units of one sample's (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH")
    p.set_defaults(func=main)


def simulate(sizes: np.ndarray, args: argparse.Namespace) -> dict[str, list[float]]:
    """Per method, each round's makespan / ideal under the true costs."""
    from dlcomm.fl import (  # `dlcomm` imports every bench module on each call: lazily
        ClientTrace,
        CostModel,
        ideal_makespan,
        makespan,
        rank_speeds,
        sample_clients,
        schedule_clients,
    )

    n = sizes.size
    trace = ClientTrace.generate(n, args.seed, speed_sigma=args.client_sigma)
    true_cost = (args.fixed_cost + sizes) / trace.speed
    speeds = rank_speeds(args.ranks, args.seed, args.rank_sigma)
    model = CostModel(sizes, args.ranks)
    rng = np.random.default_rng([args.seed, 0x4E4F])
    ratios: dict[str, list[float]] = {m: [] for m in METHODS}
    for t in range(args.rounds):
        clients = sample_clients(n, min(args.clients_per_round, n), t, args.seed,
                                 trace.available(t))
        actual = true_cost[clients] * np.exp(rng.normal(0.0, args.noise, clients.size))
        ideal = ideal_makespan(actual, speeds)
        plans = {"lpt": schedule_clients(model.predict(clients), model.rank_speed),
                 "static": schedule_clients(actual, speeds, "static"),
                 "oracle": schedule_clients(true_cost[clients], speeds)}
        for m, plan in plans.items():
            ratios[m].append(makespan(plan, actual, speeds) / ideal)
        rank_of = np.empty(clients.size, dtype=np.int64)
        for r, positions in enumerate(plans["lpt"]):
            rank_of[positions] = r
        model.observe(clients, rank_of, actual / speeds[rank_of])
    return ratios


def main(args: argparse.Namespace) -> int:
    from dlcomm.tools.bench.fl_task import TaskOptions, client_sizes  # as above

    sizes = np.array(client_sizes(TaskOptions(dataset=args.dataset, clients=args.clients,
                                              alpha=args.alpha, seed=args.seed)), float)
    ratios = simulate(sizes, args)
    kept = {m: r[args.warmup:] or r for m, r in ratios.items()}
    summary: dict[str, Any] = {
        m: {"median": statistics.median(r), "max": max(r), "mean": statistics.fmean(r)}
        for m, r in kept.items()}
    print(f"dlcomm bench fl-schedule: {args.clients} clients ({args.dataset} Dirichlet "
          f"alpha={args.alpha}), {args.clients_per_round} per round, {args.ranks} ranks "
          f"(speed sigma {args.rank_sigma}), client speed sigma {args.client_sigma}, noise "
          f"{args.noise}, rounds {args.warmup + 1}-{args.rounds} of {args.rounds}, seed "
          f"{args.seed}")
    print("| scheduler | makespan / ideal, median | mean | worst |\n|---|---:|---:|---:|")
    for m in METHODS:
        s = summary[m]
        print(f"| {m} | {s['median']:.3f} | {s['mean']:.3f} | {s['max']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args) | {"func": None}, "ratios": ratios,
                       "summary": summary}, f, indent=1)
    return 0
