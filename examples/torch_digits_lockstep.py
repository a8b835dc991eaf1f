"""``examples/torch_digits.py``'s P ranks emulated in one process, to tell a defect of a cast
from the noise of training: each step computes every rank's gradient on its own samples,
combines them the way a 16-bit all-reduce does, and takes one SGD step.

``--cast none`` sums in float32 in rank order, as dlcomm's dense path does, and gives the
distributed script's accuracies bit for bit; ``fp16`` sums the ranks' float16 gradients in
float16, then averages (dlcomm's ``fp16``); ``fp16-prescaled`` divides by P before the cast
(torch DDP's ``fp16_compress_hook``); ``fp16-scaled`` multiplies by 1024 before the cast, to
rule out underflow; ``bf16`` rounds each rank's gradient to bfloat16 and sums in float32.
Only tensors that dlcomm compresses (2-D, at least 1024 elements) are cast. Prints the
held-out accuracy per seed and their mean::

    python examples/torch_digits_lockstep.py --cast fp16 --seeds 10
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.model_selection import train_test_split
from torch_digits import MLP, load_dataset

CASTS = ("none", "fp16", "fp16-prescaled", "fp16-scaled", "bf16")
MIN_COMPRESS_SIZE = 1024  # dlcomm's default: smaller and 1-D tensors travel uncompressed


def combine(grads: list[torch.Tensor], cast: str) -> torch.Tensor:
    """The average of the ranks' gradients as the all-reduce of ``cast`` computes it."""
    ranks = len(grads)
    if cast == "none":
        total = grads[0].clone()
        for g in grads[1:]:
            total += g
        return total / ranks
    if cast == "bf16":
        total = grads[0].bfloat16().float()
        for g in grads[1:]:
            total += g.bfloat16().float()
        return total / ranks
    pre = {"fp16": 1.0, "fp16-prescaled": 1.0 / ranks, "fp16-scaled": 1024.0}[cast]
    total = (grads[0] * pre).half()
    for g in grads[1:]:
        total = total + (g * pre).half()  # float16 + float16, rounded at every addition
    post = {"fp16": 1.0 / ranks, "fp16-prescaled": 1.0, "fp16-scaled": 1.0 / (1024 * ranks)}
    return total.float() * post[cast]


def train(seed: int, cast: str, ranks: int, args: argparse.Namespace) -> float:
    """Held-out accuracy after ``args.epochs`` epochs, the distributed script's settings."""
    torch.manual_seed(seed)
    x, y = load_dataset(args.dataset)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)
    model = MLP(inputs=x.shape[1])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    steps = len(x_train) // (args.batch_size * ranks)
    for epoch in range(args.epochs):
        order = torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(len(x_train)))
        for step in range(steps):
            per_rank = []
            for r in range(ranks):
                idx = order[r::ranks][step * args.batch_size:(step + 1) * args.batch_size]
                model.zero_grad()
                F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
                per_rank.append([p.grad.clone() for p in model.parameters()])
            for i, p in enumerate(model.parameters()):
                cast_here = cast if p.dim() > 1 and p.numel() >= MIN_COMPRESS_SIZE else "none"
                p.grad = combine([g[i] for g in per_rank], cast_here)
            optimizer.step()
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cast", choices=CASTS, default="fp16")
    p.add_argument("--seeds", type=int, default=6, help="seeds 0 .. N-1")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--dataset", choices=("digits", "mnist"), default="digits")
    args = p.parse_args()
    if args.seeds < 1 or args.ranks < 1:
        p.error("--seeds and --ranks must be at least 1")
    torch.set_num_threads(1)
    accuracies = [train(seed, args.cast, args.ranks, args) for seed in range(args.seeds)]
    print(f"{args.cast} {args.dataset} ranks={args.ranks}: "
          + " ".join(f"{a:.4f}" for a in accuracies)
          + f"  mean {statistics.mean(accuracies):.4f}")


if __name__ == "__main__":
    main()
