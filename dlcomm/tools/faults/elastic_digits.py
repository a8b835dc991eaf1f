"""An elastic training script, the way a Horovod user writes one: the digits MLP of
``examples/torch_digits.py`` trained inside ``@hvd.elastic.run`` with a ``TorchState``
committed every few steps, so the job goes on when workers are lost or added::

    dlcommrun --min-np 2 --max-np 4 python -m dlcomm.tools.faults.elastic_digits --json out.json
    dlcommrun --emulate 4x1gbit --min-np 2 --max-np 4 python -m dlcomm.tools.faults.elastic_digits

It ships in the package because ``dlcomm faults`` (fault injection) trains it.

Each worker appends what it does (``start`` after each (re-)formation, ``commit``) to
``--events DIR/<worker>.jsonl``, so a fault test can check that no committed step was lost;
rank 0 of the final round writes the held-out accuracy and whether the ranks agree.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

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
    p.add_argument("--lr", type=float, default=0.025,
                   help="learning rate per rank: the optimizer's is this times the number of "
                   "ranks, re-scaled whenever the job re-forms (the linear scaling rule)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--commit-every", type=int, default=5, help="steps between commits")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="sleep this long in every step (stands for a larger model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--events", default="", help="directory for per-worker event logs")
    p.add_argument("--json", default="", help="rank 0 writes the results here")
    return p.parse_args()


class Events:
    """This worker's event log (one JSON object a line), or nothing without --events."""

    def __init__(self, directory: str) -> None:
        worker = os.environ.get("DLCOMM_ELASTIC_WORKER", f"rank{os.getpid()}::")
        self.worker, self.host = worker.split(":")[:2]
        self.path = Path(directory) / f"{self.worker}.jsonl" if directory else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields: object) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), "pid": os.getpid(),
                                "worker": self.worker, "host": self.host, "rank": hvd.rank(),
                                "size": hvd.size(), **fields}) + "\n")


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

    model = MLP(inputs=x.shape[1])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(len(x_train)), shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)
    events = Events(args.events)

    def on_reset() -> None:
        for group in optimizer.param_groups:  # the global batch changed with the ranks
            group["lr"] = args.lr * hvd.size()
        events.write("reset")

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        events.write("start", step=state.step, epoch=state.epoch)
        first_step = True
        while state.epoch < args.epochs:
            indices = list(iter(state.sampler))
            for start in range(0, len(indices), args.batch_size):
                idx = torch.tensor(indices[start:start + args.batch_size])
                optimizer.zero_grad()
                F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
                optimizer.step()
                if args.step_seconds:
                    time.sleep(args.step_seconds)
                state.step += 1
                if first_step:  # the first step after (re-)forming: recovery is over
                    events.write("first_step", step=state.step)
                    first_step = False
                state.sampler.record_batch(start // args.batch_size, len(idx))
                if state.step % args.commit_every == 0:
                    state.commit()
                    events.write("commit", step=state.step, epoch=state.epoch)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()
            events.write("commit", step=state.step, epoch=state.epoch)

    train(state)

    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                         for p in model.parameters())).hexdigest()
    accuracies = hvd.allgather_object(accuracy)
    digests = hvd.allgather_object(digest)
    events.write("done", step=state.step, accuracy=accuracy)
    if hvd.rank() == 0:
        result = {"ranks": hvd.size(), "accuracy": accuracies[0], "steps": state.step,
                  "identical_parameters": len(set(digests)) == 1, "epochs": args.epochs}
        print(json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
