"""Compressors train at the dense learning rate (issue 17): a torch MLP on scikit-learn's digits,
4 real ranks, SGD lr 0.2 momentum 0.9, compressors chosen by spec only, against dense.

Before error feedback's momentum correction this script ended with EF-SignSGD at 0.40 and
ACP-SGD (rank 4) at 0.85 against dense's 0.97 after 6 epochs, so the test fails on that code;
with it, 0.95 and 0.94. ``momentum_after_allreduce`` (the torch glue that tells error feedback the
optimizer's momentum) is checked on its own.
"""
from __future__ import annotations

import json

import pytest
from mpi_run import run_mpi

torch = pytest.importorskip("torch")

SPECS = ["none", "efsignsgd", "acpsgd:rank=4"]
EPOCHS = 6

SCRIPT = r'''
import json, sys
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
import dlcomm.torch as hvd

hvd.init()
torch.set_num_threads(1)
digits = load_digits()
x = torch.from_numpy((digits.data / 16.0).astype(np.float32))
y = torch.from_numpy(digits.target.astype(np.int64))
order = np.random.default_rng(0).permutation(len(x))
train, test = order[:1437], order[1437:]
x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
results = {}
for spec in sys.argv[2].split(";"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=spec)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    steps = len(x_train) // (16 * hvd.size())
    for epoch in range(int(sys.argv[3])):
        perm = torch.from_numpy(np.random.default_rng([1, epoch]).permutation(len(x_train)))
        mine = perm[hvd.rank()::hvd.size()]
        for step in range(steps):
            idx = mine[step * 16:(step + 1) * 16]
            opt.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat[None], name=f"check.{spec}")
    results[spec] = {"accuracy": accuracy,
                     "identical": all(torch.equal(everyone[0], e) for e in everyone)}
if hvd.rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f)
hvd.shutdown()
'''


def test_compressors_train_within_a_bound_of_dense_at_the_dense_learning_rate(tmp_path):
    out = tmp_path / "accuracy.json"
    run_mpi(4, SCRIPT, tmp_path, timeout=240, args=[str(out), ";".join(SPECS), str(EPOCHS)])
    results = json.loads(out.read_text())
    dense = results["none"]["accuracy"]
    assert dense > 0.9, results
    for spec in SPECS:
        assert results[spec]["identical"], f"{spec}: ranks ended with different parameters"
        assert results[spec]["accuracy"] >= dense - 0.06, (spec, results)


def test_momentum_after_allreduce_reads_plain_sgd_momentum_only():
    from dlcomm.torch.gradient_allreduce import momentum_after_allreduce

    w = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    sgd = torch.optim.SGD
    assert momentum_after_allreduce(sgd(w, lr=0.1, momentum=0.9)) == 0.9
    assert momentum_after_allreduce(sgd(w, lr=0.1)) == 0.0
    assert momentum_after_allreduce(sgd(w, lr=0.1, momentum=0.9, nesterov=True)) == 0.0
    assert momentum_after_allreduce(sgd(w, lr=0.1, momentum=0.9, dampening=0.1)) == 0.0
    two_groups = sgd([{"params": w[:1], "momentum": 0.9}, {"params": w[1:], "momentum": 0.5}],
                     lr=0.1)
    assert momentum_after_allreduce(two_groups) == 0.0
    same = sgd([{"params": w[:1]}, {"params": w[1:], "lr": 0.5}], lr=0.1, momentum=0.8)
    assert momentum_after_allreduce(same) == 0.8
    assert momentum_after_allreduce(torch.optim.Adam(w, lr=0.1)) == 0.0
