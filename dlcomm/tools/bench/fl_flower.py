"""Flower's simulation engine on the bench's task (``dlcomm bench fl``'s peer).

Flower runs each client's ``fit`` in a pool of Ray actors (``client_resources`` of one CPU
each, ``--actors`` of them, as many as dlcomm's ranks) and aggregates with its own FedAvg.
To train the very clients the reference trains, the strategy below samples with
``dlcomm.fl.sample_clients`` and tells each Flower node which client to be through the fit
config; ``fit`` then runs the same ``train_client`` with the same per-client seed. Times are
taken on the server: from a round's ``configure_fit`` to the end of its ``aggregate_fit``.
Needs ``flwr[simulation]`` (the ``fl-bench`` extra).
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from dlcomm.fl import client_seed, sample_clients
from dlcomm.tools.bench.fl_task import (
    TaskOptions,
    accuracy,
    make_model,
    round_summary,
    task_options,
    train_client,
)

_MODEL: dict[str, Any] = {}  # one model per Ray actor process, as one per dlcomm rank


def _actor_model(opts: TaskOptions, threads: int):  # noqa: ANN202
    import torch  # optional (the torch extra)

    if "model" not in _MODEL:
        torch.set_num_threads(threads)
        _MODEL["model"] = make_model(opts)
    return _MODEL["model"]


def run_flower_side(args: argparse.Namespace) -> None:
    # optional: flwr[simulation] (the fl-bench extra) and torch
    import torch
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    from dlcomm.torch import fl as torch_fl

    opts = task_options(args)
    names = list(torch_fl.module_weights(make_model(opts)))
    per_round, threads = args.clients_per_round, args.threads

    class BenchClient(NumPyClient):
        def fit(self, parameters, config):  # noqa: ANN001, ANN202
            model = _actor_model(opts, threads)
            torch_fl.load_weights(model, dict(zip(names, parameters)))
            client, rnd = int(config["client"]), int(config["round"])
            seed = client_seed(opts.seed, rnd, client)
            torch.manual_seed(seed % (1 << 63))
            n = train_client(model, client, seed, opts)
            weights = torch_fl.module_weights(model)
            return [weights[k] for k in names], n, {}

    class SampledFedAvg(FedAvg):
        """Flower's FedAvg, sampling dlcomm's clients and timing each round."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.starts: dict[int, float] = {}
            self.ends: dict[int, float] = {}
            self.final: list[np.ndarray] | None = None

        def configure_fit(self, server_round, parameters, client_manager):  # noqa: ANN001, ANN201
            self.starts[server_round] = time.perf_counter()
            clients = sample_clients(opts.clients, per_round, server_round - 1, opts.seed)
            client_manager.wait_for(len(clients))
            proxies = sorted(client_manager.all().values(), key=lambda p: str(p.cid))
            return [(proxy, FitIns(parameters, {"client": int(c), "round": server_round - 1}))
                    for proxy, c in zip(proxies, clients)]

        def aggregate_fit(self, server_round, results, failures):  # noqa: ANN001, ANN201
            if failures:
                raise RuntimeError(f"Flower round {server_round}: {len(failures)} clients "
                                   f"failed: {failures[0]!r}")
            out = super().aggregate_fit(server_round, results, failures)
            self.final = parameters_to_ndarrays(out[0])
            self.ends[server_round] = time.perf_counter()
            return out

    initial = torch_fl.module_weights(make_model(opts))
    strategy = SampledFedAvg(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=1, min_evaluate_clients=0,
        min_available_clients=opts.clients,
        initial_parameters=ndarrays_to_parameters([initial[k] for k in names]))

    def server_fn(context):  # noqa: ANN001, ANN202
        return ServerAppComponents(strategy=strategy, config=ServerConfig(args.rounds))

    def client_fn(context):  # noqa: ANN001, ANN202
        return BenchClient().to_client()

    start = time.perf_counter()
    run_simulation(server_app=ServerApp(server_fn=server_fn),
                   client_app=ClientApp(client_fn=client_fn), num_supernodes=opts.clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": args.actors,
                                                 "include_dashboard": False}})
    seconds = time.perf_counter() - start
    if strategy.final is None or len(strategy.ends) != args.rounds:
        raise RuntimeError(f"Flower finished {len(strategy.ends)} of {args.rounds} rounds")
    weights = dict(zip(names, strategy.final))
    model = make_model(opts)
    torch_fl.load_weights(model, weights)
    rounds = [strategy.ends[r] - strategy.starts[r] for r in sorted(strategy.ends)]
    result = {"side": "flower", "actors": args.actors, "seconds": seconds,
              **round_summary(rounds), "accuracy": accuracy(model, opts)}
    np.savez(args.json + ".npz", **weights)
    with open(args.json, "w") as f:
        json.dump(result, f)
