"""Which rank inverts which Kronecker factor: balance the inversions by cost.

Each layer has two factors (A and G) whose inversion (or eigendecomposition) costs about
n^3 each. Every inverse update, the slowest rank sets the pace, so the placement minimises
the largest per-rank load (the makespan of identical-machine scheduling, NP-hard).

Three methods, each returning the same ``Placement``:

* ``greedy``: kfac-pytorch's (KAISA's) rule: layers by decreasing cost, each to the column
  of gradient workers with the least total load, then to that column's least-loaded rank.
* ``lpt``: longest processing time first over ranks, then a local search that moves or
  swaps jobs off the most loaded rank while that lowers it.
* ``optimal`` (default): branch and bound over the jobs, seeded with the better of the two
  above; it proves the optimum on small models and otherwise returns the best placement
  found within ``node_limit`` search nodes, never worse than its seed.

With ``colocate_factors`` a layer's two factors are one job on one rank. Without it they are
two jobs that may sit on two ranks of the same column (the layer's gradient workers must hold
both inverses). Every rank computes the placement from the same inputs and gets the same
answer: the search is deterministic.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dlcomm.kfac.strategy import WorkerGrid

METHODS = ("optimal", "lpt", "greedy")
DEFAULT_NODE_LIMIT = 50_000


@dataclass(frozen=True)
class Placement:
    """The owner (rank) of each layer's factor inversions, and the resulting loads."""

    grid: WorkerGrid
    owners: Mapping[str, Mapping[str, int]]  # layer -> factor -> rank
    loads: tuple[float, ...]  # cost per rank
    optimal: bool  # True when the search proved no placement has a smaller makespan
    method: str

    @property
    def makespan(self) -> float:
        return max(self.loads) if self.loads else 0.0

    @property
    def layers(self) -> tuple[str, ...]:
        return tuple(self.owners)

    def owner(self, layer: str, factor: str) -> int:
        return self.owners[layer][factor]

    def column(self, layer: str) -> int:
        """The column whose ranks are the layer's gradient workers."""
        return self.grid.column_of(next(iter(self.owners[layer].values())))

    def grad_workers(self, layer: str) -> tuple[int, ...]:
        return self.grid.column_ranks(self.column(layer))

    def is_grad_worker(self, layer: str, rank: int) -> bool:
        return self.grid.column_of(rank) == self.column(layer)

    def src_grad_worker(self, layer: str, rank: int) -> int:
        """The gradient worker of ``layer`` that sends ``rank`` its preconditioned gradient
        (``rank`` itself when it is one): the layer's column in ``rank``'s row."""
        return self.grid.row_of(rank) * self.grid.columns + self.column(layer)


@dataclass(frozen=True)
class _Job:
    layer: int
    factors: tuple[str, ...]
    cost: float


def place_inversions(work: Mapping[str, Mapping[str, float]], grid: WorkerGrid, *,
                     colocate_factors: bool = True, method: str = "optimal",
                     node_limit: int = DEFAULT_NODE_LIMIT) -> Placement:
    """Place the inversions of ``work`` (layer -> factor -> cost, in layer order) on the ranks
    of ``grid``, minimising the most loaded rank's total cost."""
    if method not in METHODS:
        raise ValueError(f"placement method {method!r} is not one of {', '.join(METHODS)}")
    if not isinstance(grid, WorkerGrid):
        raise TypeError(f"grid must be a WorkerGrid, got {type(grid).__name__}")
    if isinstance(node_limit, bool) or not isinstance(node_limit, int) or node_limit < 0:
        raise ValueError(f"node_limit must be an int >= 0, got {node_limit!r}")
    layers = list(work)
    for layer in layers:
        factors = work[layer]
        if not factors:
            raise ValueError(f"layer {layer!r} has no factors to place")
        for factor, cost in factors.items():
            if not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
                raise ValueError(f"cost of {layer!r}/{factor!r} must be a finite number "
                                 f">= 0, got {cost!r}")
    if colocate_factors:
        jobs = [_Job(i, tuple(work[name]), float(sum(work[name].values())))
                for i, name in enumerate(layers)]
    else:
        jobs = [_Job(i, (factor,), float(cost)) for i, name in enumerate(layers)
                for factor, cost in work[name].items()]
    # Decreasing cost; ties keep layer order, so every rank sorts alike.
    order = sorted(range(len(jobs)), key=lambda j: (-jobs[j].cost, j))
    jobs = [jobs[j] for j in order]
    greedy = _kaisa_greedy(jobs, grid, colocate_factors)
    if method == "greedy":
        return _result(work, jobs, greedy, grid, False, method)
    lpt = _local_search(jobs, _lpt(jobs, grid, colocate_factors), grid, colocate_factors)
    seed = min((greedy, lpt), key=lambda a: _makespan(jobs, a, grid.world_size))
    if method == "lpt":
        return _result(work, jobs, lpt, grid, False, method)
    best, proven = _branch_and_bound(jobs, grid, colocate_factors, seed, node_limit)
    return _result(work, jobs, best, grid, proven, method)


def _result(work: Mapping[str, Mapping[str, float]], jobs: list[_Job], assignment: list[int],
            grid: WorkerGrid, proven: bool, method: str) -> Placement:
    layers = list(work)
    owners: dict[str, dict[str, int]] = {name: {} for name in layers}
    for job, rank in zip(jobs, assignment):
        for factor in job.factors:
            owners[layers[job.layer]][factor] = rank
    ordered = {name: {f: owners[name][f] for f in work[name]} for name in layers}  # caller's
    loads = _loads(jobs, assignment, grid.world_size)
    return Placement(grid, ordered, tuple(loads), proven, method)


def _loads(jobs: Sequence[_Job], assignment: Sequence[int], ranks: int) -> list[float]:
    loads = [0.0] * ranks
    for job, rank in zip(jobs, assignment):
        loads[rank] += job.cost
    return loads


def _makespan(jobs: Sequence[_Job], assignment: Sequence[int], ranks: int) -> float:
    return max(_loads(jobs, assignment, ranks), default=0.0)


def _allowed(job_index: int, jobs: Sequence[_Job], assignment: Sequence[int],
             grid: WorkerGrid, colocate: bool) -> Sequence[int]:
    """Ranks job ``job_index`` may go to given the placed jobs (-1: unplaced)."""
    if colocate:
        return range(grid.world_size)
    layer = jobs[job_index].layer
    for other, rank in enumerate(assignment):
        if rank >= 0 and other != job_index and jobs[other].layer == layer:
            return grid.column_ranks(grid.column_of(rank))
    return range(grid.world_size)


def _kaisa_greedy(jobs: Sequence[_Job], grid: WorkerGrid, colocate: bool) -> list[int]:
    """kfac-pytorch's rule: per layer, the least-loaded column, then its least-loaded rank(s)."""
    loads = [0.0] * grid.world_size
    assignment = [-1] * len(jobs)
    by_layer: dict[int, list[int]] = {}
    for j, job in enumerate(jobs):
        by_layer.setdefault(job.layer, []).append(j)
    layer_cost = {layer: sum(jobs[j].cost for j in js) for layer, js in by_layer.items()}
    for layer in sorted(by_layer, key=lambda la: (-layer_cost[la], la)):
        columns = [grid.column_ranks(c) for c in range(grid.columns)]
        totals = [sum(loads[r] for r in col) for col in columns]
        column = columns[totals.index(min(totals))]
        for j in by_layer[layer]:  # colocated: one job; otherwise the factors, costly first
            rank = min(column, key=lambda r: (loads[r], r))
            assignment[j] = rank
            loads[rank] += jobs[j].cost
    return assignment


def _lpt(jobs: Sequence[_Job], grid: WorkerGrid, colocate: bool) -> list[int]:
    """Longest processing time first: each job, in decreasing cost, to its least-loaded rank."""
    loads = [0.0] * grid.world_size
    assignment = [-1] * len(jobs)
    for j, job in enumerate(jobs):
        rank = min(_allowed(j, jobs, assignment, grid, colocate), key=lambda r: (loads[r], r))
        assignment[j] = rank
        loads[rank] += job.cost
    return assignment


def _local_search(jobs: Sequence[_Job], assignment: list[int], grid: WorkerGrid,
                  colocate: bool, rounds: int = 1000) -> list[int]:
    """Move or swap jobs off the most loaded rank while that lowers its load below the old
    maximum (and keeps the other rank below it too)."""
    assignment = list(assignment)
    loads = _loads(jobs, assignment, grid.world_size)
    eps = 1e-12 * max(1.0, sum(loads))
    for _ in range(rounds):
        top = max(range(grid.world_size), key=lambda r: (loads[r], -r))
        peak = loads[top]
        improved = False
        mine = [j for j, r in enumerate(assignment) if r == top]
        for j in mine:
            for dst in _allowed_move(j, jobs, assignment, grid, colocate):
                if dst != top and loads[dst] + jobs[j].cost < peak - eps:
                    assignment[j] = dst
                    loads[top] -= jobs[j].cost
                    loads[dst] += jobs[j].cost
                    improved = True
                    break
            if improved:
                break
        if not improved:
            for j in mine:
                for k, dst in enumerate(assignment):
                    if dst == top or jobs[k].cost >= jobs[j].cost:
                        continue
                    delta = jobs[j].cost - jobs[k].cost
                    if loads[dst] + delta >= peak - eps:
                        continue
                    if dst not in _allowed_move(j, jobs, assignment, grid, colocate) or \
                            top not in _allowed_move(k, jobs, assignment, grid, colocate):
                        continue
                    assignment[j], assignment[k] = dst, top
                    loads[top] -= delta
                    loads[dst] += delta
                    improved = True
                    break
                if improved:
                    break
        if not improved:
            break
    return assignment


def _allowed_move(j: int, jobs: Sequence[_Job], assignment: Sequence[int], grid: WorkerGrid,
                  colocate: bool) -> Sequence[int]:
    """Ranks job ``j`` may move to, its own placement aside."""
    others = list(assignment)
    others[j] = -1
    return _allowed(j, jobs, others, grid, colocate)


def _branch_and_bound(jobs: Sequence[_Job], grid: WorkerGrid, colocate: bool,
                      seed: list[int], node_limit: int) -> tuple[list[int], bool]:
    """Depth-first search for the smallest makespan, pruned by the best found so far and by
    the average-load bound; ranks whose states are interchangeable are tried once."""
    n_ranks = grid.world_size
    best = list(seed)
    best_span = _makespan(jobs, best, n_ranks)
    total = sum(job.cost for job in jobs)
    lower = max(total / n_ranks, max((j.cost for j in jobs), default=0.0))
    eps = 1e-12 * max(1.0, total)
    if not jobs or best_span <= lower + eps:
        return best, True
    siblings = [[k for k, other in enumerate(jobs) if k != i and other.layer == job.layer]
                for i, job in enumerate(jobs)]
    loads = [0.0] * n_ranks
    assignment = [-1] * len(jobs)
    # layers with a factor placed on a rank and another factor not yet placed, per rank:
    # they tie that rank's column to a later job, so such ranks are not interchangeable.
    open_layers: list[set[int]] = [set() for _ in range(n_ranks)]
    state = {"nodes": 0, "exhausted": False, "best": best, "span": best_span}

    def allowed(i: int) -> Sequence[int]:
        if colocate:
            return range(n_ranks)
        for k in siblings[i]:
            if assignment[k] >= 0:
                return grid.column_ranks(grid.column_of(assignment[k]))
        return range(n_ranks)

    def key(rank: int) -> tuple:
        if colocate:
            return (loads[rank],)
        ranks = grid.column_ranks(grid.column_of(rank))
        column = (tuple(sorted(loads[r] for r in ranks)),
                  tuple(sorted(la for r in ranks for la in open_layers[r])))
        return (column, loads[rank], tuple(sorted(open_layers[rank])))

    def visit(i: int, peak: float) -> None:
        state["nodes"] += 1
        if state["nodes"] > node_limit:
            state["exhausted"] = True
            return
        if i == len(jobs):
            if peak < state["span"] - eps:
                state["span"] = peak
                state["best"] = list(assignment)
            return
        if max(peak, lower) >= state["span"] - eps:
            return
        job = jobs[i]
        seen: set[tuple] = set()
        for rank in sorted(allowed(i), key=lambda r: (loads[r], r)):
            k = key(rank)
            if k in seen:
                continue
            seen.add(k)
            new_load = loads[rank] + job.cost
            if new_load >= state["span"] - eps:
                continue
            loads[rank] = new_load
            assignment[i] = rank
            layer = job.layer
            placed = [assignment[s] for s in siblings[i] if assignment[s] >= 0]
            opened = not colocate and len(placed) < len(siblings[i])
            if opened:
                open_layers[rank].add(layer)
            closed = [r for r in placed if layer in open_layers[r]] \
                if not colocate and not opened else []
            for r in closed:
                open_layers[r].discard(layer)
            visit(i + 1, max(peak, new_load))
            for r in closed:
                open_layers[r].add(layer)
            if opened:
                open_layers[rank].discard(layer)
            assignment[i] = -1
            loads[rank] -= job.cost
            if state["exhausted"]:
                return

    visit(0, 0.0)
    return state["best"], not state["exhausted"]
