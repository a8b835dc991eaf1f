"""K-FAC's work placement (dlcomm.kfac): the KAISA grid, inversions balanced by cost against
brute force on small cases, the layouts of the exchanged buffers, and the cost models."""
from __future__ import annotations

import itertools
import random

import pytest

from dlcomm.kfac import costs, placement, strategy
from dlcomm.kfac.exchange_plan import ExchangePlan, inverse_payload_size
from dlcomm.kfac.strategy import DistributedStrategy, WorkerGrid, resolve_grad_workers


# --- grid ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fraction,world,workers,kind", [
    (DistributedStrategy.COMM_OPT, 4, 4, DistributedStrategy.COMM_OPT),
    (DistributedStrategy.MEM_OPT, 4, 1, DistributedStrategy.MEM_OPT),
    (DistributedStrategy.HYBRID_OPT, 4, 2, DistributedStrategy.HYBRID_OPT),
    ("comm-opt", 3, 3, DistributedStrategy.COMM_OPT),
    ("MEM_OPT", 5, 1, DistributedStrategy.MEM_OPT),
    (1.0, 1, 1, DistributedStrategy.COMM_OPT),
    (0, 6, 1, DistributedStrategy.MEM_OPT),
    (0.5, 8, 4, DistributedStrategy.HYBRID_OPT),
    (0.25, 8, 2, DistributedStrategy.HYBRID_OPT),
    (1 / 3, 6, 2, DistributedStrategy.HYBRID_OPT),
])
def test_grad_worker_fraction_resolves_like_kfac_pytorch(fraction, world, workers, kind) -> None:
    grid = resolve_grad_workers(fraction, world)
    assert (grid.grad_workers, grid.strategy) == (workers, kind)
    assert grid.broadcast_inverses == (workers > 1)
    assert grid.broadcast_gradients == (workers < world)


@pytest.mark.parametrize("fraction,world,message", [
    (DistributedStrategy.HYBRID_OPT, 3, "not a whole number"),
    (0.4, 5, "equal groups"),
    (1.5, 4, r"\[0, 1\]"),
    ("fast", 4, "not a strategy"),
    (True, 4, "DistributedStrategy"),
])
def test_grad_worker_fraction_errors_say_what_to_pick(fraction, world, message) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        resolve_grad_workers(fraction, world)


@pytest.mark.parametrize("world,workers", [(1, 1), (4, 1), (4, 2), (4, 4), (6, 3), (8, 2)])
def test_grid_columns_and_rows_partition_the_ranks(world: int, workers: int) -> None:
    grid = WorkerGrid(world, workers)
    columns = [grid.column_ranks(c) for c in range(grid.columns)]
    rows = [grid.row_ranks(r) for r in range(grid.grad_workers)]
    assert sorted(r for c in columns for r in c) == list(range(world))
    assert sorted(r for row in rows for r in row) == list(range(world))
    assert all(len(c) == workers for c in columns) and all(len(r) == world // workers
                                                           for r in rows)
    for rank in range(world):
        assert rank in columns[grid.column_of(rank)] and rank in rows[grid.row_of(rank)]
    # each row meets each column exactly once: the row's all-gather covers every layer
    assert all(len(set(c) & set(r)) == 1 for c in columns for r in rows)


# --- placement against brute force ------------------------------------------------------------
def brute_force_makespan(work: dict[str, dict[str, float]], grid: WorkerGrid,
                         colocate: bool) -> float:
    """The smallest largest load over every assignment that keeps a layer's factors in one
    column (and on one rank with ``colocate``)."""
    layers = list(work)
    best = float("inf")
    if colocate:
        for ranks in itertools.product(range(grid.world_size), repeat=len(layers)):
            loads = [0.0] * grid.world_size
            for layer, rank in zip(layers, ranks):
                loads[rank] += sum(work[layer].values())
            best = min(best, max(loads))
        return best
    items = [(layer, f) for layer in layers for f in work[layer]]
    for ranks in itertools.product(range(grid.world_size), repeat=len(items)):
        where: dict[str, set[int]] = {}
        loads = [0.0] * grid.world_size
        for (layer, f), rank in zip(items, ranks):
            where.setdefault(layer, set()).add(grid.column_of(rank))
            loads[rank] += work[layer][f]
        if all(len(cols) == 1 for cols in where.values()):
            best = min(best, max(loads))
    return best


def random_work(seed: int, layers: int, integer: bool = True) -> dict[str, dict[str, float]]:
    r = random.Random(seed)
    draw = (lambda: float(r.randint(1, 12) ** 3)) if integer else (lambda: r.uniform(0, 5))
    return {f"layer{i}": {"A": draw(), "G": draw()} for i in range(layers)}


def check_valid(p: placement.Placement, work: dict, colocate: bool) -> None:
    assert set(p.owners) == set(work)
    for layer, owners in p.owners.items():
        assert set(owners) == set(work[layer])
        columns = {p.grid.column_of(r) for r in owners.values()}
        assert len(columns) == 1, f"{layer}'s factors left its column: {owners}"
        if colocate:
            assert len(set(owners.values())) == 1
    loads = [0.0] * p.grid.world_size
    for layer, owners in p.owners.items():
        for f, r in owners.items():
            loads[r] += work[layer][f]
    assert loads == pytest.approx(list(p.loads))


CASES = [(seed, layers, world, workers) for seed in range(4)
         for layers, world, workers in [(1, 3, 3), (3, 2, 2), (4, 3, 3), (5, 4, 4), (3, 4, 2),
                                        (6, 2, 1), (5, 4, 1), (2, 5, 5)]]


@pytest.mark.parametrize("seed,layers,world,workers", CASES)
def test_optimal_placement_matches_brute_force_colocated(seed, layers, world, workers) -> None:
    work = random_work(seed, layers, integer=seed % 2 == 0)
    grid = WorkerGrid(world, workers)
    best = brute_force_makespan(work, grid, True)
    got = placement.place_inversions(work, grid, colocate_factors=True)
    check_valid(got, work, True)
    assert got.optimal and got.makespan == pytest.approx(best)
    for method in ("greedy", "lpt"):
        other = placement.place_inversions(work, grid, colocate_factors=True, method=method)
        check_valid(other, work, True)
        assert other.makespan >= best - 1e-9
    # LPT with the local search keeps Graham's bound (4/3 - 1/(3m)) of the optimum
    lpt = placement.place_inversions(work, grid, colocate_factors=True, method="lpt")
    assert lpt.makespan <= (4 / 3 - 1 / (3 * world)) * best + 1e-9


@pytest.mark.parametrize("seed,layers,world,workers",
                         [c for c in CASES if c[1] * 2 <= 8 and c[2] ** (2 * c[1]) <= 70000])
def test_optimal_placement_matches_brute_force_split_factors(seed, layers, world,
                                                             workers) -> None:
    """Without colocation a layer's two factors may sit on two ranks of one column."""
    work = random_work(seed + 10, layers, integer=seed % 2 == 1)
    grid = WorkerGrid(world, workers)
    best = brute_force_makespan(work, grid, False)
    got = placement.place_inversions(work, grid, colocate_factors=False)
    check_valid(got, work, False)
    assert got.optimal and got.makespan == pytest.approx(best)
    greedy = placement.place_inversions(work, grid, colocate_factors=False, method="greedy")
    check_valid(greedy, work, False)
    assert greedy.makespan >= best - 1e-9


def test_optimal_beats_kaisa_greedy_where_greedy_is_known_to_lose() -> None:
    """LPT's classic bad case: 2 ranks, jobs 3,3,2,2,2 (optimum 6, LPT 7)."""
    work = {f"l{i}": {"A": c, "G": 0.0} for i, c in enumerate([3.0, 3.0, 2.0, 2.0, 2.0])}
    grid = WorkerGrid(2, 2)
    assert placement.place_inversions(work, grid, method="greedy").makespan == 7.0
    best = placement.place_inversions(work, grid)
    assert best.makespan == 6.0 and best.optimal


def test_placement_is_deterministic_and_covers_more_ranks_than_layers() -> None:
    work = random_work(3, 3)
    grid = WorkerGrid(5, 5)
    first = placement.place_inversions(work, grid)
    assert first == placement.place_inversions(dict(work), grid)
    assert sorted(first.loads, reverse=True)[3:] == [0.0, 0.0]  # two idle ranks


def test_node_limit_returns_the_seed_unproven_and_large_cases_stay_valid() -> None:
    work = random_work(5, 40, integer=False)
    grid = WorkerGrid(4, 4)
    quick = placement.place_inversions(work, grid, node_limit=0)
    lpt = placement.place_inversions(work, grid, method="lpt")
    check_valid(quick, work, True)
    assert not quick.optimal and quick.makespan <= lpt.makespan + 1e-12
    full = placement.place_inversions(work, grid)
    check_valid(full, work, True)
    assert full.makespan <= quick.makespan + 1e-12


def test_placement_queries() -> None:
    grid = WorkerGrid(4, 2)  # columns {0, 2} and {1, 3}; rows {0, 1} and {2, 3}
    p = placement.Placement(grid, {"a": {"A": 2, "G": 0}, "b": {"A": 3, "G": 3}}, (1.0,) * 4,
                            True, "optimal")
    assert p.column("a") == 0 and p.grad_workers("a") == (0, 2)
    assert p.is_grad_worker("a", 2) and not p.is_grad_worker("a", 1)
    assert p.src_grad_worker("a", 1) == 0 and p.src_grad_worker("a", 3) == 2
    assert p.src_grad_worker("b", 0) == 1 and p.src_grad_worker("b", 3) == 3


def test_placement_refuses_bad_input() -> None:
    grid = WorkerGrid(2, 2)
    with pytest.raises(ValueError, match="not one of"):
        placement.place_inversions({"a": {"A": 1.0}}, grid, method="best")
    with pytest.raises(ValueError, match="finite number"):
        placement.place_inversions({"a": {"A": -1.0}}, grid)
    with pytest.raises(ValueError, match="no factors"):
        placement.place_inversions({"a": {}}, grid)
    with pytest.raises(TypeError, match="WorkerGrid"):
        placement.place_inversions({"a": {"A": 1.0}}, 2)
    with pytest.raises(ValueError, match="equal groups"):
        WorkerGrid(3, 2)


# --- exchange layouts ---------------------------------------------------------------------------
@pytest.mark.parametrize("method,symmetric", [("eigen", True), ("inverse", True),
                                              ("inverse", False)])
@pytest.mark.parametrize("world,workers", [(4, 4), (4, 1), (4, 2), (3, 3), (2, 1)])
def test_exchange_layouts_cover_every_item_once(method, symmetric, world, workers) -> None:
    dims = {"c1": (10, 4), "c2": (37, 8), "f1": (73, 16), "f2": (17, 3), "f3": (5, 2)}
    grid = WorkerGrid(world, workers)
    work = costs.placement_work(dims, "compute", method)
    p = placement.place_inversions(work, grid, colocate_factors=(workers == 1))
    plan = ExchangePlan(p, dims, method, symmetric)
    ready = {"c1", "c2", "f1", "f3"}  # f2 has no factors yet: left out everywhere
    for column in range(grid.columns):
        segs = plan.inverse_segments(column, ready)
        assert {(s.layer, s.factor) for s in segs} == {
            (la, f) for la in plan.column_layers(column, ready) for f in ("A", "G")}
        offset = 0
        for rank in grid.column_ranks(column):  # members in rank order, contiguous
            mine = [s for s in segs if s.rank == rank]
            assert [(s.layer, s.factor) for s in mine] == plan.owned(rank, ready)
            for s in mine:
                assert s.offset == offset
                dim = dims[s.layer][0 if s.factor == "A" else 1]
                assert s.size == inverse_payload_size(dim, method, symmetric)
                offset += s.size
    for row in range(grid.grad_workers):
        segs = plan.grad_segments(row, ready)
        assert sorted(s.layer for s in segs) == sorted(ready)
        assert [s.offset for s in segs] == list(itertools.accumulate(
            [0] + [s.size for s in segs[:-1]]))
        assert all(s.size == dims[s.layer][0] * dims[s.layer][1] for s in segs)
        assert all(p.column(s.layer) == grid.column_of(s.rank) for s in segs)


def test_inverse_payload_sizes() -> None:
    assert inverse_payload_size(4, "eigen", True) == 20
    assert inverse_payload_size(4, "inverse", True) == 10
    assert inverse_payload_size(4, "inverse", False) == 16
    with pytest.raises(ValueError, match="compute_method"):
        inverse_payload_size(4, "cholesky", True)


# --- costs -----------------------------------------------------------------------------------
def test_cost_models_and_preconditioning_on_the_owner() -> None:
    dims = {"a": (10, 4), "b": (3, 20)}
    assert costs.placement_work(dims, "compute", "eigen") == {
        "a": {"A": 1000.0, "G": 64.0}, "b": {"A": 27.0, "G": 8000.0}}
    assert costs.placement_work(dims, "memory", "eigen")["a"] == {"A": 100.0, "G": 16.0}
    mem_opt = costs.placement_work(dims, "compute", "inverse", inv_update_steps=5,
                                   preconditioning_on_owner=True)
    per_step = costs.preconditioning_flops(4, 10, "inverse") / 2.0
    assert mem_opt["a"]["G"] == pytest.approx(64.0 + 5 * per_step)
    assert costs.preconditioning_flops(4, 10, "eigen") == 2 * costs.preconditioning_flops(
        4, 10, "inverse")
    with pytest.raises(ValueError, match="needs the measured seconds"):
        costs.placement_work(dims, "measured", "eigen")
    with pytest.raises(ValueError, match="no measured inversion time"):
        costs.placement_work(dims, "measured", "eigen", measured={10: 1.0})
    with pytest.raises(ValueError, match="not one of"):
        costs.placement_work(dims, "speed", "eigen")


def test_measured_costs_are_positive_for_each_size_and_feed_the_placement() -> None:
    seconds = costs.measure_inversion_seconds([8, 3, 8, 16], "inverse", repeats=1)
    assert sorted(seconds) == [3, 8, 16] and all(s > 0 for s in seconds.values())
    work = costs.placement_work({"a": (16, 3), "b": (8, 8)}, "measured", "inverse",
                                measured=seconds)
    assert work["a"] == {"A": seconds[16], "G": seconds[3]}
    with pytest.raises(ValueError, match="compute_method"):
        costs.measure_inversion_seconds([3], "lu")


def test_strategy_module_names() -> None:
    assert [s.value for s in strategy.DistributedStrategy] == ["comm-opt", "mem-opt",
                                                               "hybrid-opt"]
