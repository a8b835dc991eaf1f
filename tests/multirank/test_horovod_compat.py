"""What Horovod's own test suite taught, kept as dlcomm's tests on real ranks.

Each case once hung under Horovod's suite: a broadcast whose root had joined, a step where
some parameters got no gradient on some ranks, a reduce-scatter over every dtype. The jobs
run with DLCOMM_STALL_SHUTDOWN_SECONDS set, so a regression fails with an error naming the
missing ranks long before the test's timeout. Also here: names that are unique per process
set, a broadcast root named by its world rank, and fused variable-size all-gathers.

The cases that leave no process state behind run in one job per rank count, in turn (one
start-up of MPI and torch instead of one per case); each case catches its own error and every
rank writes each case's result, or traceback, to a file of its own. The join cases, which are
about process state, keep a job each.
"""
import json

import pytest
from mpi_run import run_mpi
from shared_job import SharedJobs, read_rank_results

STALL = {"DLCOMM_STALL_SHUTDOWN_SECONDS": "30", "DLCOMM_STALL_WARNING_SECONDS": "10"}

JOIN_BROADCAST_SCRIPT = r'''
import json, sys
import torch
import dlcomm.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
seen = []
for first in range(n):
    if r == first:
        last = hvd.join()
    else:
        try:
            hvd.broadcast(torch.ones(17, 17), first, name="bcast.from.joined")
            raise AssertionError("a broadcast whose root joined did not raise")
        except hvd.DLCommError as exc:  # a RuntimeError, as Horovod's
            assert "joined" in str(exc), exc
        last = hvd.join()
    assert last != first, (last, first)
    seen.append(hvd.allgather_object(last))
    assert seen[-1] == [last] * n, seen[-1]
# after everyone joined, collectives work again
assert hvd.broadcast(torch.full((2,), float(r)), n - 1).tolist() == [n - 1.0] * 2
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(seen, f)
'''

CASES_SCRIPT = r'''
import itertools, json, random, sys, traceback
import numpy as np
import dlcomm as hvd
try:  # the torch cases' tests are skipped without torch; the others run
    import torch
    import torch.nn.functional as F
    import dlcomm.torch as thvd
except ImportError:
    torch = None

cases, out = sys.argv[1].split(","), sys.argv[2]
hvd.init()
r, n = hvd.rank(), hvd.size()


def no_gradient():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = (torch.nn.Linear(12, 6), torch.nn.Linear(6, 4),
                                            torch.nn.Linear(4, 4))

        def forward(self, x):
            x1 = self.fc2(F.relu(self.fc1(x)))
            return x1, self.fc3(F.relu(x1))

    kinds = sorted((c.__name__, c) for c in torch.optim.Optimizer.__subclasses__()
                   if c.__module__.startswith("torch.optim")
                   and c.__name__ not in ("LBFGS", "SparseAdam", "Muon"))
    stepped = []
    for name, cls in kinds:
        torch.manual_seed(0)
        model = Net()
        opt = thvd.DistributedOptimizer(cls(model.parameters(), lr=0.01),
                                        named_parameters=model.named_parameters())
        x = torch.randn(8, 12, generator=torch.Generator().manual_seed(r))
        y1, y2 = model(x)
        # rank 0's loss never reaches fc3: its gradients are still all-reduced (as zeros)
        loss = y1.pow(2).sum() if r == 0 else y2.pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        everyone = thvd.allgather(flat[None])
        assert all(torch.equal(everyone[0], e) for e in everyone), name
        stepped.append(name)
    return stepped


def reducescatter():
    checked = 0
    for dtype, dim, rows in itertools.product(
            [torch.int32, torch.int64, torch.float32, torch.float64, torch.float16], [1, 2, 3],
            [n * 4, n + 1, max(n - 1, 1)]):  # divisible, uneven, fewer rows than ranks
        torch.manual_seed(1234)
        x = torch.randint(-100, 100, [rows] + [5] * (dim - 1)).to(dtype)
        out = thvd.reducescatter(x, op=thvd.Sum)
        base, extra = divmod(rows, n)
        start = r * base + min(r, extra)
        mine = base + (1 if r < extra else 0)
        expected = x[start:start + mine].double() * n
        assert list(out.shape) == [mine] + [5] * (dim - 1), (dtype, dim, rows, out.shape)
        assert out.dtype == dtype and torch.equal(out.double(), expected), (dtype, dim, rows)
        grouped = thvd.grouped_reducescatter([x, x], op=thvd.Average)
        assert all(torch.allclose(g.double(), expected / n, atol=0.5) for g in grouped)
        checked += 1
    return checked


def process_set():
    evens = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
    odds = hvd.add_process_set([k for k in range(n) if k % 2 == 1])
    mine, members = (evens, evens.ranks) if r % 2 == 0 else (odds, odds.ranks)
    # the same name in two sets is two requests; unnamed calls are numbered per set
    for step in range(3):
        s = hvd.allreduce(np.array([float(r)]), name="loss", op=hvd.Sum, process_set=mine)
        assert s[0] == sum(members), (step, s)
        if r % 2 == 0:  # only the evens make an extra unnamed call...
            hvd.allreduce(np.array([1.0]), process_set=mine)
        # ...which must not shift the names of the world's unnamed calls
        w = hvd.allreduce(np.array([float(r)]), op=hvd.Sum)
        assert w[0] == sum(range(n)), (step, w)
    # a broadcast root is a world rank, as in Horovod
    root = members[-1]
    b = hvd.broadcast(np.array([r, r]), root, process_set=mine)
    assert b.tolist() == [root, root], b
    obj = hvd.broadcast_object({"from": r}, root, process_set=mine)
    assert obj == {"from": root}, obj
    other = odds if mine is evens else evens
    if other.ranks:
        try:
            hvd.broadcast(np.array([r]), other.ranks[0], process_set=mine)
            raise AssertionError("a root outside the process set was accepted")
        except ValueError as exc:
            assert "not a member" in str(exc), exc
    return "ok"


def allgather():
    DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.float16,
              np.float32, np.float64, np.bool_]
    SIZES = [17, 32, 0, 12, 3, 23, 22][:n]  # first dimensions differ; one rank has no rows

    def tensor(dtype, dim):
        value = r % 2 if dtype == np.bool_ else r
        return np.full([SIZES[r]] + [17] * (dim - 1), value).astype(dtype)

    def check(out, dtype, dim):
        assert out.shape == tuple([sum(SIZES)] + [17] * (dim - 1)) and out.dtype == dtype
        start = 0
        for k in range(n):
            value = k % 2 if dtype == np.bool_ else k
            assert (out[start:start + SIZES[k]] == value).all(), (dtype, dim, k)
            start += SIZES[k]

    specs = list(itertools.product(DTYPES, [1, 2, 3]))
    for rep in range(3):  # repeated: the response cache serves the later rounds
        # fused: every all-gather in flight at once, submitted in a different order per rank
        order = list(range(len(specs)))
        random.Random(1000 * rep + r).shuffle(order)
        handles = {k: hvd.allgather_async(tensor(*specs[k]), name=f"fused.{k}") for k in order}
        for k, (dtype, dim) in enumerate(specs):
            check(hvd.synchronize(handles[k]), dtype, dim)
        # unnamed, one after another, and grouped
        for dtype, dim in specs:
            check(hvd.allgather(tensor(dtype, dim)), dtype, dim)
        outs = hvd.grouped_allgather([tensor(np.float32, 2), tensor(np.float32, 3)])
        check(outs[0], np.float32, 2)
        check(outs[1], np.float32, 3)
    return "ok"


def timeline():
    for k, mark in enumerate([True, False, True]):
        hvd.start_timeline(f"{out}/tl{k}.{{rank}}.json", mark_cycles=mark)
        hvd.allreduce(np.ones(3), name="test_allreduce")
        hvd.stop_timeline()
        hvd.allreduce(np.ones(3), name="after_stop")  # not recorded
        events = json.load(open(f"{out}/tl{k}.{r}.json"))
        rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        assert "test_allreduce" in rows and "after_stop" not in rows, rows
        assert any(e.get("name") == "communicate" for e in events)
        assert any(e.get("name") == "CYCLE_START" for e in events) == mark, k
    hvd.start_timeline(f"{out}/only_rank0.json")  # without '{rank}': rank 0 writes
    hvd.allreduce(np.ones(3), name="one_file")
    hvd.stop_timeline()
    return "ok"


for case in cases:
    try:
        result = {"result": globals()[case](), "error": None}
    except Exception:  # recorded for this case's test; the next cases still run
        result = {"result": None, "error": traceback.format_exc()}
    with open(f"{out}/{case}.rank{r}.json", "w") as f:
        json.dump(result, f)
'''

# the cases of CASES_SCRIPT each rank count runs, in this order (the timeline, which starts
# and stops a global recorder, last)
CASES_BY_RANKS = {2: ["no_gradient", "reducescatter", "process_set", "allgather", "timeline"],
                  3: ["no_gradient", "reducescatter", "process_set", "allgather"],
                  4: ["reducescatter", "process_set"], 5: ["reducescatter", "allgather"]}


UNNAMED_AFTER_JOIN_SCRIPT = r'''
import json, re, sys
import numpy as np
import dlcomm as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
seen = []
JOINED = re.compile(r"ranks \[([0-9, ]+)\] have joined")
for first in range(n):
    if r == first:
        last = hvd.join()
    else:
        # Unnamed: this rank's numbering is ahead of the ranks that joined earlier, so the
        # other ranks' calls carry other names; each must fail on its own, never wait.
        for call in (lambda: hvd.allgather(np.ones((r + 1, 3))),
                     lambda: hvd.alltoall(np.ones(2 * n))):
            try:
                call()
                raise AssertionError("a collective after another rank joined did not raise")
            except hvd.DLCommError as exc:
                # The error names the ranks joined when this call ran: ``first``, and maybe
                # ranks that already finished this round's calls and joined to end it.
                joined = JOINED.search(str(exc))
                assert joined and first in [int(k) for k in joined.group(1).split(",")], exc
        last = hvd.join()
    seen.append(hvd.allgather_object(last))
assert hvd.allgather(np.full((1, 2), float(r)), name="after").ravel().tolist() == [
    float(k) for k in range(n) for _ in range(2)]
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(seen, f)
'''


def _run(np_, script, tmp_path, timeout=240):
    run_mpi(np_, script, tmp_path, timeout=timeout, args=[str(tmp_path)], env=STALL)
    return [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(np_)]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """``cases(np_, case)``: every rank's result of ``case`` from the one job of ``np_`` ranks
    (started on first use), and the job's folder; fails naming the case, rank and traceback
    of an error."""
    def start(np_):
        out = tmp_path_factory.mktemp(f"compat{np_}")
        run_mpi(np_, CASES_SCRIPT, out, timeout=420, env=STALL,
                args=[",".join(CASES_BY_RANKS[np_]), str(out)])
        return out

    jobs = SharedJobs(CASES_BY_RANKS, start)

    def results(np_, case):
        out = jobs.folder(np_, case)
        found = read_rank_results(out, np_, case, lambda c, k: f"{c}.rank{k}.json")
        return [res["result"] for res in found], out

    return results


@pytest.mark.parametrize("np_", [2, 3])
def test_broadcast_whose_root_joined_raises_on_every_other_rank(np_, tmp_path):
    pytest.importorskip("torch")
    results = _run(np_, JOIN_BROADCAST_SCRIPT, tmp_path)
    assert all(res == results[0] for res in results), results
    assert len(results[0]) == np_


@pytest.mark.parametrize("np_", [2, 3])
def test_step_completes_when_some_ranks_produce_no_gradient(np_, cases):
    pytest.importorskip("torch")
    results, _ = cases(np_, "no_gradient")
    assert all(res == results[0] for res in results) and "SGD" in results[0], results


@pytest.mark.parametrize("np_", [2, 3, 4, 5])
def test_reducescatter_of_every_dtype_and_uneven_rows(np_, cases):
    pytest.importorskip("torch")
    assert cases(np_, "reducescatter")[0] == [45] * np_


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_names_are_per_process_set_and_roots_are_world_ranks(np_, cases):
    assert cases(np_, "process_set")[0] == ["ok"] * np_


@pytest.mark.parametrize("np_", [2, 3, 5])
def test_fused_variable_size_allgathers_of_every_dtype(np_, cases):
    assert cases(np_, "allgather")[0] == ["ok"] * np_


def test_start_and_stop_timeline_while_running(cases):
    results, out = cases(2, "timeline")
    assert results == ["ok"] * 2
    json.loads((out / "only_rank0.json").read_text())


@pytest.mark.parametrize("np_", [3, 4])
def test_unnamed_calls_after_a_join_fail_on_every_rank_though_numbered_differently(
        np_, tmp_path):
    results = _run(np_, UNNAMED_AFTER_JOIN_SCRIPT, tmp_path)
    assert all(res == results[0] for res in results), results
    assert len(results[0]) == np_
