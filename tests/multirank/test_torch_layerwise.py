"""LARS and LAMB under DistributedOptimizer on real ranks: with the wfbp, mgwfbp and none
schedules (uneven layer sizes) training on every rank's batch equals one process training on
the concatenated batches, with warm-up and decay; dear, which updates slices of tensors on
each rank, refuses them (a trust ratio needs the whole tensor's norm)."""
import json

import pytest
from mpi_run import run_mpi

torch = pytest.importorskip("torch")

SCRIPT = r'''
import json, sys
import torch
import dlcomm.torch as hvd

out = sys.argv[1]
hvd.init()
r, n = hvd.rank(), hvd.size()


def model_fn():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(10, 13), torch.nn.LayerNorm(13), torch.nn.Tanh(),
                               torch.nn.Linear(13, 3))


def make_opt(kind, model):
    groups = hvd.exclude_bias_and_norm(model, weight_decay=1e-3)
    if kind == "lars":
        return hvd.LARS(groups, lr=2.0, momentum=0.9, trust_coefficient=0.01)
    return hvd.LAMB(groups, lr=0.02)


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 10, generator=g), torch.randint(0, 3, (6,), generator=g)


loss_fn = torch.nn.CrossEntropyLoss()
worst = {}
for kind in ("lars", "lamb"):
    try:
        hvd.DistributedOptimizer(make_opt(kind, model_fn()), schedule="dear")
        raise AssertionError("dear accepted a trust-ratio optimizer")
    except ValueError as exc:
        assert "dear" in str(exc), exc
    for schedule in ("wfbp", "mgwfbp", "none"):
        model, ref = model_fn(), model_fn()
        opt = hvd.DistributedOptimizer(make_opt(kind, model), schedule=schedule,
                                       named_parameters=model.named_parameters())
        assert isinstance(opt, hvd.LARS if kind == "lars" else hvd.LAMB)
        ref_opt = make_opt(kind, ref)
        sched = hvd.warmup_lr_scheduler(opt, warmup_steps=2, total_steps=6)
        ref_sched = hvd.warmup_lr_scheduler(ref_opt, warmup_steps=2, total_steps=6)
        for step in range(6):
            x, y = batch(step, r)
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            xs = torch.cat([batch(step, k)[0] for k in range(n)])
            ys = torch.cat([batch(step, k)[1] for k in range(n)])
            ref_opt.zero_grad()
            loss_fn(ref(xs), ys).backward()
            ref_opt.step()
            ref_sched.step()
        diffs = [float((p - q).detach().abs().max())
                 for p, q in zip(model.parameters(), ref.parameters())]
        moved = max(float((p - q).detach().abs().max())
                    for p, q in zip(model.parameters(), model_fn().parameters()))
        assert moved > 1e-3, (kind, schedule, moved)  # training did change the parameters
        worst[f"{kind}.{schedule}"] = max(diffs)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = hvd.allgather(flat[None])
        assert all(torch.equal(gathered[0], g) for g in gathered), (kind, schedule)
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(worst, f)
'''


@pytest.mark.parametrize("np_", [2, 3, 5])
def test_lars_and_lamb_equal_single_process(np_, tmp_path):
    run_mpi(np_, SCRIPT, tmp_path, timeout=300, args=[str(tmp_path)])
    for r in range(np_):
        worst = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert set(worst) == {f"{k}.{s}" for k in ("lars", "lamb")
                              for s in ("wfbp", "mgwfbp", "none")}
        assert all(v < 1e-4 for v in worst.values()), (r, worst)
