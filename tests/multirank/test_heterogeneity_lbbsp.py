"""LB-BSP: integer batch sizes within bounds that sum to B, predictors, the sampler, and the
b_i/B-weighted gradient sum equal to the full-batch gradient."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from mpi_run import run_mpi

from dlcomm.heterogeneity.lbbsp import (
    BatchBalancer,
    MovingAveragePredictor,
    NARXPredictor,
    allocate_batches,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=9), st.integers(1, 500),
       st.integers(0, 20), st.integers(1, 400))
@example([1.0, 1.0, 2.0], 42, 14, 15)  # floor and ceiling hit in one round: summed to 43
def test_allocation_sums_to_total_within_bounds(speeds, total, lo, hi) -> None:
    n = len(speeds)
    if lo > hi or not n * lo <= total <= n * hi:
        with pytest.raises(ValueError):
            allocate_batches(speeds, total, lo, hi)
        return
    sizes = allocate_batches(speeds, total, lo, hi)
    assert sum(sizes) == total
    assert all(isinstance(b, int) and lo <= b <= hi for b in sizes)


def test_allocation_is_proportional_to_speed() -> None:
    assert allocate_batches([1, 1, 2], 64) == [16, 16, 32]
    assert allocate_batches([1, 3], 10, min_batch=4) == [4, 6]
    assert allocate_batches([1, 100], 10, max_batch=6) == [4, 6]


def test_allocation_validates() -> None:
    with pytest.raises(ValueError):
        allocate_batches([1.0, -1.0], 10)
    with pytest.raises(ValueError):
        allocate_batches([], 10)
    with pytest.raises(TypeError):
        allocate_batches([1.0], 10.5)  # type: ignore[arg-type]


def test_balancer_moves_work_away_from_a_straggler() -> None:
    bal = BatchBalancer(64, 4, rank=1, min_batch=2, max_batch=40)
    assert bal.batch_sizes == [16, 16, 16, 16]
    for _ in range(5):
        sizes = bal.update_from_speeds([100.0, 50.0, 100.0, 100.0])
    assert sum(sizes) == 64 and sizes[1] < sizes[0]
    assert bal.local_batch == sizes[1] and bal.weight == pytest.approx(sizes[1] / 64)
    assert bal.offsets() == [0, sizes[0], sizes[0] + sizes[1], 64 - sizes[3]]


@pytest.mark.parametrize("interval, resized_at", [
    (8, [2, 6, 14, 22, 30]), (3, [2, 5, 8, 11]), (1, list(range(1, 9))), (2, [2, 4, 6, 8])])
def test_update_ramps_up_to_its_interval(monkeypatch: pytest.MonkeyPatch, interval: int,
                                         resized_at: list[int]) -> None:
    """Re-sizes after 2, 4, ... iterations, then every ``interval``: balanced within the
    first steps of a job, steady afterwards."""
    from dlcomm import mpi_ops

    gathered: list[int] = []
    bal = BatchBalancer(60, 2, rank=0, interval=interval)

    def allgather(mine: np.ndarray, name: str) -> np.ndarray:
        gathered.append(bal.iterations)
        return np.array([mine[0], mine[0] / 2])  # rank 1 at half this rank's speed

    monkeypatch.setattr(mpi_ops, "allgather", allgather)
    for _ in range(max(resized_at)):
        bal.update(bal.local_batch, 0.01)
    assert gathered == resized_at
    assert bal.batch_sizes == [40, 20]  # balanced from the first re-size on


@pytest.mark.parametrize("model", ["ridge", "mlp"])
def test_narx_learns_a_periodic_speed(model: str) -> None:
    """A speed that alternates 100/50 is predicted better than by a moving average."""
    narx, ema = NARXPredictor(lags=2, model=model, refit_every=5), MovingAveragePredictor()
    pattern = [100.0, 50.0]
    err_narx, err_ema = [], []
    for t in range(60):
        s = np.array([pattern[t % 2], 80.0])
        if t > 30:
            err_narx.append(abs(narx.predict()[0] - s[0]))
            err_ema.append(abs(ema.predict()[0] - s[0]))
        narx.observe(s, np.array([32.0, 32.0]))
        ema.observe(s, np.array([32.0, 32.0]))
    assert np.mean(err_narx) < 0.5 * np.mean(err_ema)


def test_sampler_hands_out_disjoint_consecutive_slices() -> None:
    torch = pytest.importorskip("torch")  # noqa: F841
    from dlcomm.torch.heterogeneity.lbbsp import BalancedBatchSampler

    seen = []
    for rank in range(3):
        bal = BatchBalancer(10, 3, rank)
        bal.batch_sizes = [2, 5, 3]
        sampler = BalancedBatchSampler(47, bal, seed=1)
        batches = list(sampler)
        assert len(batches) == 4 and all(len(b) == [2, 5, 3][rank] for b in batches)
        seen.append(batches)
    order = np.random.default_rng(1).permutation(47)
    for step in range(4):
        joined = seen[0][step] + seen[1][step] + seen[2][step]
        assert joined == order[step * 10:(step + 1) * 10].tolist()


LBBSP_SCRIPT = r'''
import json, sys
import numpy as np, torch
import dlcomm.torch as hvd
from dlcomm.torch.sync import BalancedBatchSampler
schedules, out = sys.argv[1].split(","), sys.argv[2]
hvd.init()
rank, n = hvd.rank(), hvd.size()


def run(SCHEDULE):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   sync="lbbsp:global_batch=12,min_batch=1,max_batch=8",
                                   schedule=SCHEDULE)
    bal = opt.balancer
    data = torch.randn(40, 4, generator=torch.Generator().manual_seed(7))
    target = torch.randn(40, 2, generator=torch.Generator().manual_seed(8))
    sampler = BalancedBatchSampler(40, bal, seed=3)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(),
                                    torch.nn.Linear(3, 2))
    reference.load_state_dict(model.state_dict())
    steps = 0
    for step, idx in enumerate(sampler):
        if step == 0:
            bal.batch_sizes = [2, 7, 3]  # uneven on purpose (same on every rank)
            idx = next(iter(sampler))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(data[idx]), target[idx]).backward()
        opt.step()
        sizes = bal.batch_sizes
        everyone = hvd.allgather(torch.tensor([sizes]), name=f"{SCHEDULE}.sizes{step}")
        assert all(everyone[r].tolist() == sizes for r in range(n)), (SCHEDULE, everyone)
        assert sum(sizes) == 12 and all(1 <= b <= 8 for b in sizes), (SCHEDULE, sizes)
        if step == 0:
            order = np.random.default_rng(3).permutation(40)[:12]
            reference.zero_grad()
            torch.nn.functional.mse_loss(reference(data[order]), target[order]).backward()
            for p, q in zip(model.parameters(), reference.parameters()):
                assert torch.allclose(p.grad, q.grad, atol=1e-6), (
                    SCHEDULE, (p.grad - q.grad).abs().max())
        steps += 1
        if step == 2:
            break
    with open(f"{out}/rank{rank}_{SCHEDULE}.json", "w") as f:
        json.dump({"steps": steps}, f)


# One job runs every schedule in turn (a fresh model and optimizer each): one start-up of
# MPI and torch instead of one per schedule. An assertion fails the whole job, naming the
# schedule; each schedule's test then checks that every rank wrote its result.
for schedule in schedules:
    run(schedule)
if rank == 0:
    print("LBBSP OK")
hvd.shutdown()
'''

LBBSP_SCHEDULES = ["wfbp", "none"]


@pytest.fixture(scope="module")
def lbbsp_job(tmp_path_factory):
    """One 3-rank job for every schedule; returns the folder of its per-rank, per-schedule
    results."""
    out = tmp_path_factory.mktemp("lbbsp")
    run_mpi(3, LBBSP_SCRIPT, out, timeout=240, args=[",".join(LBBSP_SCHEDULES), str(out)])
    return out


@pytest.mark.parametrize("schedule", LBBSP_SCHEDULES)
def test_lbbsp_weighted_gradient_is_the_full_batch_gradient(lbbsp_job, schedule) -> None:
    for r in range(3):
        result = lbbsp_job / f"rank{r}_{schedule}.json"
        assert result.exists(), f"{schedule}: rank {r} wrote no result"
        assert json.loads(result.read_text()) == {"steps": 3}, (schedule, r)
