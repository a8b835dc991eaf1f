"""DS-Sync: partitions agreed without messages, group averaging, S = N equals BSP."""
from __future__ import annotations

import pytest
from mpi_run import run_mpi

from dlcomm.heterogeneity.dssync import partition


@pytest.mark.parametrize("n,s", [(8, 2), (8, 3), (5, 2), (4, 4), (4, 8), (1, 1)])
def test_partition_covers_every_rank_once(n: int, s: int) -> None:
    for index in range(5):
        groups = partition(n, s, seed=3, index=index)
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(n))
        sizes = [len(g) for g in groups]
        assert max(sizes) - min(sizes) <= 1 and max(sizes) <= max(s, 1) or s >= n


def test_partition_is_a_pure_function_and_shuffles() -> None:
    assert partition(8, 2, 7, 3) == partition(8, 2, 7, 3)
    assert len({str(partition(8, 2, 7, k)) for k in range(8)}) > 1


def test_partition_validates() -> None:
    with pytest.raises(ValueError):
        partition(0, 2, 0, 0)
    with pytest.raises(TypeError):
        partition(4, 2.0, 0, 0)  # type: ignore[arg-type]


def test_dssync_on_four_ranks(tmp_path) -> None:
    """One job: same membership everywhere, group averages against numpy, S=N equals BSP."""
    run_mpi(4, r'''
import numpy as np, torch
import dlcomm, dlcomm.torch as hvd
from dlcomm.heterogeneity.dssync import GroupCycle, average_in_group, partition
hvd.init()
rank, n = hvd.rank(), hvd.size()

# identical membership on all ranks, matching the pure partition
cycle = GroupCycle(2, seed=5, cycle=4)
mine = np.array([cycle.group_ranks(t) for t in range(8)], dtype=np.int64)
everyone = dlcomm.allgather(mine[None], name="membership")
for t in range(8):
    groups = partition(n, 2, 5, t % 4)
    for r in range(n):
        assert list(everyone[r, t]) == next(g for g in groups if r in g), (r, t)

# group average equals the numpy mean over the group's members
for t in range(4):
    x = np.arange(6, dtype=np.float64) + 10.0 * rank + t
    out = average_in_group([x.copy()], cycle, t)[0]
    members = cycle.group_ranks(t)
    ref = np.mean([np.arange(6) + 10.0 * r + t for r in members], axis=0)
    assert np.allclose(out, ref), (rank, t, out, ref)

# a member with a different layout is reported on every member of its group, no hang
bad = GroupCycle(2, seed=5, cycle=4)
x = np.zeros(7 if rank == 0 else 6, dtype=np.float32)
try:
    average_in_group([x], bad, 0)
    assert 0 not in bad.group_ranks(0), "rank 0's group must refuse"
except hvd.MismatchError as e:
    members = bad.group_ranks(0)
    assert 0 in members and f"DS-Sync group {members}" in str(e), e
    assert f"elements: rank {members[0]}: " in str(e) and "rank 0: 7" in str(e), e
average_in_group([np.zeros(6, np.float32)], bad, 1) if 0 not in bad.group_ranks(1) else None
def train(sync, steps=4, momentum=0.9):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), sync=sync)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    opt.synchronize_globally() if hasattr(opt, "synchronize_globally") else None
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

bsp = train("bsp")
full = train(f"dssync:group_size={n}")
assert torch.equal(bsp, full), (bsp - full).abs().max()
# parameter averaging over all ranks (the DS-Sync path, forced) also equals BSP for SGD
from dlcomm.torch.heterogeneity.dssync import make_dssync_optimizer
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
opt = make_dssync_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                            group_size=n, seed=0, cycle=2)
assert opt._cycle.group_ranks(0) == list(range(n))  # one group of all ranks: averaging
g = torch.Generator().manual_seed(100 + rank)
for _ in range(4):
    x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
avg = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
assert torch.allclose(avg, bsp, atol=1e-5), (avg - bsp).abs().max()
# S=2: after synchronize_globally every rank holds the same model
small = train("dssync:group_size=2")
allp = hvd.allgather(small[None], name="final")
assert all(torch.allclose(allp[0], allp[r], atol=1e-6) for r in range(n))
if rank == 0:
    print("DSSYNC OK")
hvd.shutdown()
''', tmp_path, timeout=240)


def test_sync_modes_follow_a_dlcomm_started_on_a_subset(tmp_path) -> None:
    """init(comm=...) on parts of the world ([0, 1, 2] and [3]): DS-Sync and DLCP from the
    torch adapter average within their own part (they build their communicators from
    dlcomm's, not the world's)."""
    run_mpi(4, r'''
import torch
from mpi4py import MPI
import dlcomm.torch as hvd
from dlcomm.heterogeneity.dssync import partition
world = MPI.COMM_WORLD.Get_rank()
part = [0, 1, 2] if world < 3 else [3]
hvd.init(comm=part)
assert hvd.size() == len(part)

def one_step(**sync):
    model = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), **sync)
    opt.zero_grad()
    model(torch.full((1, 4), float(world + 1))).sum().backward()  # gradient: world rank + 1
    opt.step()
    return model.weight.detach().reshape(-1)

def minus_mean(ranks):  # dlcomm ranks of this part -> minus the mean of (world rank + 1)
    return -sum(part[r] + 1 for r in ranks) / len(ranks)

group = next(g for g in partition(hvd.size(), 2, 0, 0) if hvd.rank() in g)
cases = [({"sync": "dssync:group_size=2"}, minus_mean(group)),  # 3 ranks: groups of 2 and 1
         ({"loss_tolerance": 0.1}, minus_mean(range(hvd.size())))]  # tiny tensor: no loss
for sync, expected in cases:
    w = one_step(**sync)
    assert torch.allclose(w, torch.full((4,), expected)), (world, sync, w, expected)
hvd.shutdown()
''', tmp_path, timeout=180)
