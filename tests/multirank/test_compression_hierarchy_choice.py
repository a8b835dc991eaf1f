"""``topk:hierarchical=auto`` on real ranks grouped into pretend hosts: each tensor goes flat
or hierarchical as the costs say, every rank chooses alike, and the result is bit for bit
what the chosen compressor alone gives, over several steps of error feedback. Where ranks do
not span several hosts of several ranks, it is flat top-k and nothing is measured.
"""
from __future__ import annotations

import pytest
from mpi_run import run_mpi

SCRIPT = r'''
import os
import numpy as np
from mpi4py import MPI
from dlcomm.compression import MPICommAdapter, get_compressor
from dlcomm.compression.branch_costs import BranchCosts
from dlcomm.compression.exchange import run_rounds
from dlcomm.compression.hierarchy_choice import HierarchyChoice

world = MPI.COMM_WORLD
comm = MPICommAdapter(world)
P, rank = comm.size, comm.rank
HIERARCHY = os.environ["EXPECT_HIERARCHY"] == "1"


def build(spec):
    return get_compressor(spec, min_compress_size=0)


def same_everywhere(label, value):
    everyone = world.allgather(value)
    assert all(v == everyone[0] for v in everyone), f"{label}: ranks disagree: {everyone}"


def steps(compressor, shapes, count=3):
    """run_rounds of every shape's tensor together, ``count`` steps; the results per step."""
    out = []
    for step in range(count):
        rng = np.random.default_rng([rank, step, 26])
        items = [(compressor, rng.standard_normal(s).astype(np.float32), f"t{i}")
                 for i, s in enumerate(shapes)]
        out.append([value for value, _ in run_rounds(items, comm, True)])
    return out


# 1. Given costs that cross over at about 700 elements: 480 and 63 elements go flat, 1200
#    and 4101 hierarchical, where ranks span several hosts of several ranks.
shapes = [(24, 20), (7, 9), (40, 30), (1367, 3)]
crossing = BranchCosts((64, 1024), {"topk": (0.001, 0.003), "htopk": (0.002, 0.0025)})
choice = HierarchyChoice(build("topk:ratio=0.1"), build("htopk:ratio=0.1"), costs=crossing)
got = steps(choice, shapes)
want_choice = {"t0": "topk", "t1": "topk", "t2": "htopk", "t3": "htopk"} if HIERARCHY \
    else {f"t{i}": "topk" for i in range(len(shapes))}
assert choice.choices == want_choice, choice.choices
flat, hier = steps(build("topk:ratio=0.1"), shapes), steps(build("htopk:ratio=0.1"), shapes)
for step in range(3):
    for i in range(len(shapes)):
        want = (hier if want_choice[f"t{i}"] == "htopk" else flat)[step][i]
        assert got[step][i].dtype == want.dtype and np.array_equal(got[step][i], want), \
            (step, i)
        everyone = world.allgather(got[step][i])
        assert all(np.array_equal(e, everyone[0]) for e in everyone), (step, i)

# 2. A checkpoint keeps the choices and both error feedbacks: the next step after loading
#    equals the next step of the uninterrupted run.
resumed = HierarchyChoice(build("topk:ratio=0.1"), build("htopk:ratio=0.1"),
                          costs=BranchCosts((64, 1024), {"topk": (1.0, 1.0),
                                                         "htopk": (2.0, 2.0)}))
resumed.load_state_dict(choice.state_dict())
assert resumed.choices == want_choice
rng = np.random.default_rng([rank, 9, 26])
xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
a = run_rounds([(choice, x, f"t{i}") for i, x in enumerate(xs)], comm, True)
b = run_rounds([(resumed, x, f"t{i}") for i, x in enumerate(xs)], comm, True)
assert all(np.array_equal(u, v) for (u, _), (v, _) in zip(a, b))

# 3. Measured: every rank holds the same costs and makes the same choices, and each tensor's
#    result is its chosen compressor's. Nothing is measured without a hierarchy to use.
auto = build("topk:ratio=0.1,hierarchical=auto")
got = steps(auto, shapes, count=2)
if HIERARCHY:
    assert auto.costs is not None
    same_everywhere("costs", (auto.costs.sizes, sorted(auto.costs.seconds.items())))
else:
    assert auto.costs is None and set(auto.choices.values()) == {"topk"}, auto.choices
same_everywhere("choices", sorted(auto.choices.items()))
flat, hier = steps(build("topk:ratio=0.1"), shapes, 2), steps(build("htopk:ratio=0.1"), shapes, 2)
for step in range(2):
    for i in range(len(shapes)):
        want = (hier if auto.choices[f"t{i}"] == "htopk" else flat)[step][i]
        assert np.array_equal(got[step][i], want), (step, i, auto.choices)

# 4. A later job on the same hosts (a new communicator: nothing cached on it) reads the
#    costs from DLCOMM_COMPRESSION_COST_CACHE instead of measuring, and chooses alike.
import dlcomm.compression.branch_costs as branch_costs


def no_measuring(*args, **kwargs):
    raise AssertionError("measured although the cache holds the costs")


branch_costs.measure_branch_costs = no_measuring
later = build("topk:ratio=0.1,hierarchical=auto")
rng = np.random.default_rng([rank, 0, 26])
run_rounds([(later, rng.standard_normal(s).astype(np.float32), f"t{i}")
            for i, s in enumerate(shapes)], MPICommAdapter(world.Dup()), True)
assert later.choices == auto.choices, (later.choices, auto.choices)
if HIERARCHY:
    assert later.costs == auto.costs
print(f"OK {rank} {sorted(set(auto.choices.values()))}", flush=True)
'''


@pytest.mark.parametrize("np_,per_host,hierarchy", [
    (4, 2, True),   # 2 hosts of 2
    (5, 2, False),  # 2 + 2 + 1: a host of one rank, nothing to sum inside it
    (3, 0, False),  # one host (the shared-memory split)
    (2, 1, False),  # 2 hosts of one rank
])
def test_hierarchy_choice_on_pretend_hosts(np_, per_host, hierarchy, tmp_path):
    proc = run_mpi(np_, SCRIPT, tmp_path, timeout=240,
                   env={"DLCOMM_HIERARCHICAL_RANKS_PER_HOST": per_host,
                        "EXPECT_HIERARCHY": int(hierarchy)})
    assert proc.count_per_rank("OK") == [1] * np_, proc.report()


ENGINE_SCRIPT = r'''
import numpy as np
import dlcomm as hvd
from mpi4py import MPI
from dlcomm.compression import MPICommAdapter, compressed_allreduce, get_compressor
from dlcomm.compression.branch_costs import BranchCosts

hvd.init()
r = hvd.rank()
rng = np.random.default_rng(r)
xs = [rng.standard_normal(s).astype(np.float32) for s in [(64, 32), (10,), (37, 5)]]
ref_comm = MPICommAdapter(MPI.COMM_WORLD.Dup())
spec = "topk:ratio=0.1,hierarchical=auto,start_iter=1"
engine_c, ref_c = get_compressor(spec), get_compressor(spec)
# Equal costs: the first listed (flat) wins the tie; set on the choice inside DenseStart.
for c in (engine_c, ref_c):
    c.inner.fixed_costs = BranchCosts((64, 1024), {"topk": (1.0, 2.0), "htopk": (1.0, 2.0)})
for step in range(3):
    hs = [hvd.allreduce_async(x, name=f"h.{k}", compression=engine_c) for k, x in enumerate(xs)]
    got = [hvd.synchronize(h) for h in hs]
    want = [compressed_allreduce(ref_c, x, f"h.{k}", ref_comm) for k, x in enumerate(xs)]
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), step
    if step == 0:  # start_iter=1: the first exchange is dense, the exact mean
        mean = hvd.allreduce(xs[0], name="dense.check")
        assert np.allclose(got[0], mean, rtol=1e-6, atol=1e-6)
assert engine_c.inner.choices == {"h.0": "topk"}, engine_c.inner.choices
# Measured for real (2 hosts of 2): the probes do not count in dlcomm.bytes_sent(), so the
# first exchange counts the same bytes as the next (exact top-k: the same k every step).
measured = get_compressor("topk:ratio=0.1,hierarchical=auto")
counted = []
for step in range(2):
    before = hvd.bytes_sent()
    hvd.allreduce(xs[0] * (step + 1), name="m.0", compression=measured)
    counted.append(hvd.bytes_sent() - before)
assert measured.costs is not None and counted[0] == counted[1] > 0, counted
print(f"OK {r}", flush=True)
hvd.shutdown()
'''


def test_hierarchy_choice_through_the_engine_equals_the_direct_driver(tmp_path):
    proc = run_mpi(4, ENGINE_SCRIPT, tmp_path, timeout=180,
                   env={"DLCOMM_HIERARCHICAL_RANKS_PER_HOST": 2})
    assert proc.count_per_rank("OK") == [1] * 4, proc.report()
