"""Every point-to-point collective equals MPI's own on random data, for 1 to 8 ranks.

One mpirun per rank count runs all algorithms over sizes (0, 1, p-1, p, 7, 1000, 65537),
dtypes (float32/64, int32/64) and ops (sum, min, max, product), out of place and in
place, against ``comm.Allreduce``: exactly for integers and min/max, to float tolerance
for float sums and products; the rank-order ones (``ordered``, ``pipelined`` with 64-byte
segments, ``auto``) also bit for bit against the rank-order reduction.
Reduce-scatter (ring and ordered) and all-gather with unequal and zero counts, the ordered
reduce-scatter + all-gather against the ordered all-reduce bit for bit, binomial broadcast
and reduce from every root, and hierarchical all-reduce with forced host groups of 2 and 3
ranks are checked in the same run.
"""
from __future__ import annotations

import pytest
from mpi_run import run_mpi

EQUALS_NATIVE = r"""
import sys
import numpy as np
from mpi4py import MPI
from dlcomm.collectives import (
    HierarchicalAllreduce, auto_allgather, auto_reduce_scatter, binomial_broadcast,
    binomial_reduce, get_allreduce_algorithm, mesh_allgather, ordered_reduce_scatter,
    ordered_tcp_reduce_scatter, pipelined_allreduce, ring_allgather, ring_reduce_scatter,
)
from dlcomm.comm.mpi_backend import mpi_op

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
rng = np.random.default_rng(1000 + r)
failures = []

hier2 = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=2)
hier3 = HierarchicalAllreduce(
    comm, hierarchical_ranks_per_host=3, hierarchical_leader_algorithm="rhd"
)
hier2_tree = HierarchicalAllreduce(
    comm, hierarchical_ranks_per_host=2, hierarchical_leader_algorithm="tree"
)
assert hier2.host_count == (p + 1) // 2 and hier3.host_count == (p + 2) // 3
ALGS = {name: get_allreduce_algorithm(name)
        for name in ("ordered", "ordered_tcp", "auto", "ring", "ring_tcp", "rhd", "tree",
                     "hierarchical", "fastest")}
# Segments of 64 bytes: many segments per block (up to the cap) at these sizes.
ALGS["pipelined/64B"] = lambda c, s, o, op: pipelined_allreduce(c, s, o, op,
                                                                allreduce_segment_bytes=64)
RANK_ORDER = ("ordered", "ordered_tcp", "auto", "pipelined/64B")
SOME_DTYPES_ONLY = ("hierarchical/2 tree", "fastest")  # 64-bit dtypes suffice: saves time
ALGS["hierarchical/2 ring"] = lambda c, s, o, op: hier2(s, o, op)
ALGS["hierarchical/3 rhd"] = lambda c, s, o, op: hier3(s, o, op)
ALGS["hierarchical/2 tree"] = lambda c, s, o, op: hier2_tree(s, o, op)
SIZES = sorted({0, 1, max(p - 1, 0), p, 7, 1000, 65537})
DTYPES = [np.float32, np.float64, np.int32, np.int64]
OPS = ["sum", "min", "max", "product"]


def make(n, dtype, op):
    if np.dtype(dtype).kind == "i":
        if op == "product":
            return rng.integers(-3, 4, n).astype(dtype)
        return rng.integers(-10**6, 10**6, n).astype(dtype)
    if op == "product":
        return rng.uniform(0.5, 1.5, n).astype(dtype)
    return rng.uniform(-1, 1, n).astype(dtype)


def in_rank_order(x, op):
    # Every rank's x reduced as ((x_0 op x_1) op x_2) ... in the dtype: ordered's result.
    ufunc = {"sum": np.add, "min": np.minimum, "max": np.maximum, "product": np.multiply}[op]
    copies = comm.allgather(x)
    out = copies[0].copy()
    for c in copies[1:]:
        ufunc(out, c, out=out)
    return out


def same(got, want, dtype, op):
    if np.dtype(dtype).kind == "i" or op in ("min", "max"):
        return np.array_equal(got, want)
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    return np.allclose(got, want, rtol=tol, atol=tol)


# The native reference itself agrees with plain numpy on gathered inputs.
x = rng.standard_normal(1000)
want = np.empty_like(x)
comm.Allreduce(x, want, op=MPI.SUM)
if not np.allclose(want, np.sum(comm.allgather(x), axis=0), rtol=1e-12, atol=1e-12):
    failures.append("native Allreduce differs from numpy sum of the gathered inputs")

for n in SIZES:
    for dtype in DTYPES:
        for op in OPS:
            x = make(n, dtype, op)
            want = np.empty_like(x)
            comm.Allreduce(x, want, op=mpi_op(op))
            ordered = in_rank_order(x, op)
            for name, alg in ALGS.items():
                if name in SOME_DTYPES_ONLY and dtype in (np.float32, np.int32):
                    continue
                case = f"{name} n={n} {np.dtype(dtype)} {op}"
                x_before = x.copy()
                out = np.full_like(x, 7)
                res = alg(comm, x, out, op)
                if res is not out or not same(out, want, dtype, op):
                    failures.append(case + " out of place: wrong result")
                if name in RANK_ORDER and not np.array_equal(out, ordered):
                    failures.append(case + ": not the bits of the rank-order reduction")
                if not np.array_equal(x, x_before):
                    failures.append(case + " out of place: sendbuf modified")
                buf = x.copy()
                alg(comm, buf, buf, op)
                if not same(buf, want, dtype, op):
                    failures.append(case + " in place: wrong result")

COUNT_LISTS = [
    [3] * p,
    [(3 * i + 1) % 5 for i in range(p)],   # unequal, with zeros once p > 1
    [0] * p,
    [0] * (p - 1) + [1000],                # everything on the last rank
    [1000 + i for i in range(p)],
]
for counts in COUNT_LISTS:
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    own = slice(offsets[r], offsets[r + 1])
    for dtype in (np.float64, np.int32):
        for op in ("sum", "max"):
            case = f"counts={counts} {np.dtype(dtype)} {op}"
            x = make(int(offsets[-1]), dtype, op)
            full = np.empty_like(x)
            comm.Allreduce(x, full, op=mpi_op(op))
            x_before = x.copy()
            for name, reduce_scatter in (("ring", ring_reduce_scatter),
                                         ("ordered_tcp", ordered_tcp_reduce_scatter),
                                         ("auto", auto_reduce_scatter),
                                         ("ordered", ordered_reduce_scatter)):
                out = np.full(counts[r], 7, dtype=dtype)
                res = reduce_scatter(comm, x, out, counts, op)
                if res is not out or not same(out, full[own], dtype, op):
                    failures.append(f"{name} reduce_scatter " + case)
                if not np.array_equal(x, x_before):
                    failures.append(f"{name} reduce_scatter modified sendbuf " + case)
            if not np.array_equal(out, in_rank_order(x, op)[own]):
                failures.append("ordered reduce_scatter: not the rank-order bits " + case)
        mine = make(counts[r], dtype, "sum")
        want = np.empty(int(offsets[-1]), dtype=dtype)
        comm.Allgatherv(mine, [want, counts])
        got = np.full_like(want, 7)
        ring_allgather(comm, mine, got, counts)
        if not np.array_equal(got, want):
            failures.append(f"allgather counts={counts} {np.dtype(dtype)}")
        got = np.full_like(want, 7)
        got[own] = mine
        ring_allgather(comm, got[own], got, counts)
        if not np.array_equal(got, want):
            failures.append(f"allgather in place counts={counts} {np.dtype(dtype)}")
        for name, allgather in (("mesh", mesh_allgather), ("auto", auto_allgather)):
            got = np.full_like(want, 7)
            if allgather(comm, mine, got, counts) is not got or not np.array_equal(got, want):
                failures.append(f"{name} allgather counts={counts} {np.dtype(dtype)}")

# The ordered pair: reduce-scatter then all-gather gives the all-reduce's bits, whatever the
# split (equal blocks, uneven ones, zeros) and on both of the all-reduce's paths (whole
# buffers gathered when small, reduce-scatter + all-gather when large).
ordered = get_allreduce_algorithm("ordered")
for n in sorted({1, max(p - 1, 1), p + 1, 2 * p + 1, 1001, 40001}):
    for dtype in (np.float16, np.float32, np.float64):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 4, n)).astype(dtype)
        whole = np.empty_like(x)
        ordered(comm, x, whole, "sum")
        for counts in ([n // p + (1 if i < n % p else 0) for i in range(p)],
                       [n] + [0] * (p - 1), [0] * (p - 1) + [n]):
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int)
            part = np.empty(counts[r], dtype=dtype)
            ordered_reduce_scatter(comm, x, part, counts, "sum")
            gathered = np.empty_like(x)
            comm.Allgatherv(part.view(np.uint8),
                            [gathered.view(np.uint8), [c * x.itemsize for c in counts]])
            if not np.array_equal(gathered.view(np.uint8), whole.view(np.uint8)):
                failures.append(f"ordered reduce_scatter + allgather != allreduce n={n} "
                                f"{np.dtype(dtype)} counts={counts}")

for root in range(p):
    for n in (0, 5, 65537):
        want = make(n, np.float64, "sum")
        comm.Bcast(want, root=root)
        got = want.copy() if r == root else np.full_like(want, 7)
        binomial_broadcast(comm, got, root=root)
        if not np.array_equal(got, want):
            failures.append(f"binomial_broadcast root={root} n={n}")
        x = make(n, np.int64, "sum")
        want = np.empty_like(x)
        comm.Allreduce(x, want, op=MPI.SUM)
        got = np.empty_like(x)
        binomial_reduce(comm, x, got, "sum", root=root)
        if r == root and not np.array_equal(got, want):
            failures.append(f"binomial_reduce root={root} n={n}")

print(f"rank {r}: {len(failures)} failures", *failures[:20], sep="\n  ")
sys.exit(1 if failures else 0)
"""


# 1-5 ranks (every split of the house rules) and 8, a power of two past them; 6 and 7 added
# 25 s to every CI run and no case 5 and 8 miss.
@pytest.mark.parametrize("np_ranks", [1, 2, 3, 4, 5, 8])
def test_every_algorithm_equals_native(np_ranks, tmp_path):
    """Ring, RHD, tree, hierarchical, reduce-scatter, all-gather, broadcast equal MPI's."""
    proc = run_mpi(np_ranks, EQUALS_NATIVE, tmp_path, timeout=150)
    assert proc.count_per_rank(": 0 failures") == [1] * np_ranks, proc.report()


HIERARCHICAL_CACHE = r"""
import numpy as np
from mpi4py import MPI
from dlcomm.collectives import (
    HierarchicalAllreduce, cached_hierarchical_allreduce, get_allreduce_algorithm,
)

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
first = cached_hierarchical_allreduce(comm, hierarchical_ranks_per_host=2)
assert first is cached_hierarchical_allreduce(comm, hierarchical_ranks_per_host=2), "not cached"
assert first is not cached_hierarchical_allreduce(
    comm, hierarchical_ranks_per_host=2, hierarchical_leader_algorithm="rhd"
)
assert first.host_count == 2 and first.is_leader == (r % 2 == 0), first

# Without an override (None or 0) every rank here shares memory: one host, one leader.
real = HierarchicalAllreduce(comm)
assert real.host_count == 1, real
assert HierarchicalAllreduce(comm, hierarchical_ranks_per_host=0).host_count == 1

# The env settings reach the registry entry (read on the first call per communicator).
x = np.arange(10, dtype=np.float64) * (r + 1)
out = np.empty_like(x)
get_allreduce_algorithm("hierarchical")(comm, x, out, "sum")
assert np.array_equal(out, np.arange(10) * sum(range(1, p + 1))), out
used = cached_hierarchical_allreduce(comm)
assert used.ranks_per_host == 2 and used.leader_algorithm == "tree", used

# The cache lives on the communicator: a Dup gets its own, freed with the Dup.
dup = comm.Dup()
other = cached_hierarchical_allreduce(dup, hierarchical_ranks_per_host=2)
assert other is not first
other(x, out, "max")
assert np.array_equal(out, np.arange(10) * p), out
dup.Free()
assert other.local_comm == MPI.COMM_NULL and other.leader_comm == MPI.COMM_NULL
try:
    other(x, out, "sum")
except ValueError as exc:
    assert "freed" in str(exc)
else:
    raise AssertionError("a freed HierarchicalAllreduce still ran")
print(f"rank {r}: cache ok")
"""


def test_hierarchical_subcommunicators_are_cached_per_communicator(tmp_path):
    """Sub-communicators are built once per parent and settings, and freed with the parent."""
    env = {
        "DLCOMM_HIERARCHICAL_RANKS_PER_HOST": "2",
        "DLCOMM_HIERARCHICAL_LEADER_ALGORITHM": "tree",
    }
    proc = run_mpi(4, HIERARCHICAL_CACHE, tmp_path, timeout=60, env=env)
    assert proc.count_per_rank("cache ok") == [1] * 4, proc.report()


ERRORS = r"""
import numpy as np
from mpi4py import MPI
from dlcomm.collectives import (
    HierarchicalAllreduce, algorithm_from_env, auto_allreduce, binomial_broadcast,
    binomial_reduce, get_allreduce_algorithm, native_allreduce, ordered_allreduce,
    ordered_reduce_scatter,
    ring_allgather, ring_allreduce, ring_reduce_scatter,
)
from dlcomm.errors import DLCommError

comm = MPI.COMM_WORLD
r = comm.Get_rank()
x = np.zeros(4)


def raises(kind, fragment, func, *args, **kwargs):
    try:
        func(*args, **kwargs)
    except kind as exc:
        assert fragment in str(exc), f"{fragment!r} not in {exc}"
    else:
        raise AssertionError(f"{func.__name__}{args} did not raise {kind.__name__}")


raises(ValueError, "valid names: auto, ordered, ordered_tcp, pipelined, mpi, ring, ring_tcp, "
       "rhd, tree, hierarchical, fastest (also native = mpi)", get_allreduce_algorithm, "butterfly")
raises(TypeError, "string", get_allreduce_algorithm, 3)
assert get_allreduce_algorithm(" Ring ") is ring_allreduce
assert algorithm_from_env({}) is auto_allreduce
assert algorithm_from_env({"DLCOMM_ALLREDUCE_ALGORITHM": "ordered"}) is ordered_allreduce
assert algorithm_from_env({"DLCOMM_ALLREDUCE_ALGORITHM": "native"}) is native_allreduce
assert algorithm_from_env({"DLCOMM_ALLREDUCE_ALGORITHM": "rhd"}).__name__ == "rhd_allreduce"
raises(ValueError, "DLCOMM_ALLREDUCE_ALGORITHM", algorithm_from_env,
       {"DLCOMM_ALLREDUCE_ALGORITHM": "fast"})
for name in ("auto", "ordered", "ordered_tcp", "pipelined", "native", "ring", "ring_tcp", "rhd",
             "tree", "hierarchical", "fastest"):
    alg = get_allreduce_algorithm(name)
    raises(TypeError, "MPI.Intracomm", alg, "comm", x, x, "sum")
    raises(TypeError, "numpy.ndarray", alg, comm, [0.0] * 4, x, "sum")
    raises(ValueError, "1-D", alg, comm, np.zeros((2, 2)), np.zeros((2, 2)), "sum")
    raises(ValueError, "contiguous", alg, comm, np.zeros(8)[::2], x, "sum")
    raises(ValueError, "must match", alg, comm, np.zeros(3), x, "sum")
    raises(TypeError, "dtype", alg, comm, np.zeros(4, np.float32), x, "sum")
    raises(TypeError, "numeric", alg, comm, np.zeros(4, bool), np.zeros(4, bool), "sum")
    raises(ValueError, "Average", alg, comm, x, x.copy(), "average")
    raises(ValueError, "unknown reduce op", alg, comm, x, x.copy(), "median")
    shared = np.zeros(8)
    raises(ValueError, "overlap", alg, comm, shared[:4], shared[1:5], "sum")
    ro = np.zeros(4)
    ro.flags.writeable = False
    raises(ValueError, "read-only", alg, comm, x, ro, "sum")
for reduce_scatter in (ring_reduce_scatter, ordered_reduce_scatter):
    raises(ValueError, "one count per rank", reduce_scatter, comm, x, np.zeros(2), [2, 2, 0],
           "sum")
    raises(ValueError, ">= 0", reduce_scatter, comm, x, np.zeros(4), [-1] * comm.Get_size(),
           "sum")
    raises(ValueError, "sum(counts)", reduce_scatter, comm, x, np.zeros(5),
           [5] + [0] * (comm.Get_size() - 1), "sum")
    raises(ValueError, "Average", reduce_scatter, comm, x, np.zeros(4),
           [4] + [0] * (comm.Get_size() - 1), "average")
raises(ValueError, "sum(counts)", ring_allgather, comm, x[:1], np.zeros(5),
       [1] * comm.Get_size())
raises(ValueError, "outside", binomial_broadcast, comm, x, root=comm.Get_size())
raises(ValueError, "ranks_per_host", HierarchicalAllreduce, comm, hierarchical_ranks_per_host=-1)
raises(ValueError, "leader_algorithm", HierarchicalAllreduce, comm,
       hierarchical_leader_algorithm="hierarchical")

# Ranks that disagree on the size get a DLCommError, not a silent truncation.
if comm.Get_size() == 2:
    mine = np.ones(4 if r == 0 else 8)
    if r == 0:
        raises(DLCommError, "same size", binomial_reduce, comm, mine, np.empty_like(mine))
    else:
        binomial_reduce(comm, mine, np.empty_like(mine))
print(f"rank {r}: errors ok")
"""


@pytest.mark.parametrize("np_ranks", [1, 2])
def test_bad_arguments_raise_actionable_errors(np_ranks, tmp_path):
    """Unknown names, wrong buffers, ops and counts raise TypeError/ValueError/DLCommError."""
    proc = run_mpi(np_ranks, ERRORS, tmp_path, timeout=60)
    assert proc.count_per_rank("errors ok") == [1] * np_ranks, proc.report()
