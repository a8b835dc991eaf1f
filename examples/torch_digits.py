"""A plain Horovod-style training script, the way a user writes one: a 3-layer MLP
(64-256-256-10, 85,002 parameters) on scikit-learn's digits, SGD with momentum.

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
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 256)
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
    p.add_argument("--json", default="", help="rank 0 writes the results here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2,
                                                        random_state=0, stratify=y)
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = MLP()
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
                  "momentum": args.momentum, "batch_size": args.batch_size}
        print(json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
