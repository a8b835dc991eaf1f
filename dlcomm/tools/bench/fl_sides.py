"""The processes ``dlcomm bench fl`` starts, one per side of the comparison:

    python -m dlcomm.tools.bench.fl_sides reference  ...   single process, the reference model
    dlcommrun -np 4 python -m dlcomm.tools.bench.fl_sides dlcomm ...   dlcomm's simulation
    python -m dlcomm.tools.bench.fl_sides flower ...       Flower's simulation (Ray)
    python -m dlcomm.tools.bench.fl_sides one-client ...   one process training one client

Each writes a JSON result (rank 0 for dlcomm) and the final weights as .npz, so the parent
can compare every side's model with the reference's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from dlcomm.tools.bench.fl_task import (
    DATASETS,
    TaskOptions,
    accuracy,
    client_sizes,
    make_model,
    round_summary,
    task_options,
    train_client,
)
from dlcomm.tools.bench.process_memory import peak_rss_of_self

SIDES = ("reference", "dlcomm", "flower", "one-client")


def add_task_arguments(p: argparse.ArgumentParser, with_clients: bool = True) -> None:
    p.add_argument("--dataset", choices=DATASETS, default="mnist")
    if with_clients:
        p.add_argument("--clients", type=int, default=100)
    p.add_argument("--clients-per-round", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)


def task_arguments(args: argparse.Namespace) -> list[str]:
    """The command-line form of the task arguments in ``args`` (for a child process)."""
    return ["--dataset", args.dataset, "--clients", str(args.clients),
            "--clients-per-round", str(args.clients_per_round), "--rounds", str(args.rounds),
            "--alpha", str(args.alpha), "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--lr", str(args.lr),
            "--hidden", str(args.hidden), "--seed", str(args.seed)]


def train_fn(opts: TaskOptions):  # noqa: ANN201 - the dlcomm.torch.fl train function
    def train(model, client, ctx):  # noqa: ANN001, ANN202
        return train_client(model, client, ctx.seed, opts)

    return train


def _write(path: str, result: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    np.savez(path + ".npz", **weights)
    with open(path, "w") as f:
        json.dump(result, f)


def run_reference_side(args: argparse.Namespace) -> None:
    import torch  # optional (the torch extra), like every torch import here

    from dlcomm.torch import fl as torch_fl

    opts = task_options(args)
    torch.set_num_threads(args.threads)
    model = make_model(opts)
    start = time.perf_counter()
    weights, _ = torch_fl.run_reference(model, train_fn(opts), opts.clients,
                                        args.clients_per_round, args.rounds, "fedavg",
                                        seed=opts.seed)
    torch_fl.load_weights(model, weights)
    _write(args.json, {"side": "reference", "seconds": time.perf_counter() - start,
                       "accuracy": accuracy(model, opts)}, weights)


def run_dlcomm_side(args: argparse.Namespace) -> None:
    import dlcomm.torch as hvd  # optional (the torch extra)
    from dlcomm.torch import fl as torch_fl

    opts = task_options(args)
    hvd.init()
    model = make_model(opts)
    sim = torch_fl.Simulation(model, train_fn(opts), opts.clients, args.clients_per_round,
                              "fedavg", client_sizes=client_sizes(opts), seed=opts.seed)
    reports = sim.run(args.rounds)
    memory = sim.memory_summary()
    sim.close()
    if hvd.rank() == 0:
        result = {"side": "dlcomm", "ranks": hvd.size(), **round_summary(
            [r.seconds for r in reports]), "accuracy": accuracy(sim.load_global(), opts),
            "ranks_peak_rss_bytes": memory["peak_rss_bytes"],
            "predicted_makespan": [r.predicted_makespan for r in reports],
            "ideal_makespan": [r.ideal_makespan for r in reports],
            "busy_seconds": [r.busy_seconds.tolist() for r in reports]}
        _write(args.json, result, sim.weights)


def run_one_client_side(args: argparse.Namespace) -> None:
    """One client in a process of its own, as a one-process-per-client simulator runs it:
    the model, the data and one local update of the largest client."""
    import torch  # optional (the torch extra)

    opts = task_options(args)
    torch.set_num_threads(args.threads)
    model = make_model(opts)
    client = int(np.argmax(client_sizes(opts)))
    train_client(model, client, 0, opts)
    with open(args.json, "w") as f:
        json.dump({"side": "one-client", "client": client,
                   "peak_rss_bytes": peak_rss_of_self()}, f)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlcomm.tools.bench.fl_sides",
                                description=__doc__.splitlines()[0])
    p.add_argument("side", choices=SIDES)
    add_task_arguments(p)
    p.add_argument("--json", required=True, help="result file (weights go to JSON.npz)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process "
                   "(dlcommrun sets the ranks' own)")
    p.add_argument("--actors", type=int, default=4, help="Flower: parallel client actors")
    args = p.parse_args(argv)
    if args.side == "reference":
        run_reference_side(args)
    elif args.side == "dlcomm":
        run_dlcomm_side(args)
    elif args.side == "one-client":
        run_one_client_side(args)
    else:
        from dlcomm.tools.bench.fl_flower import run_flower_side  # needs flwr, optional

        run_flower_side(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
