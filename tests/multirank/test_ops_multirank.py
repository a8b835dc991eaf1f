"""Every collective of the numpy API on real MPI ranks, against a numpy reference."""
import pytest
from mpi_run import run_mpi

OPS_SCRIPT = r'''
import random
import numpy as np
import dlcomm as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
assert 0 <= hvd.local_rank() < hvd.local_size() and hvd.local_size() * hvd.cross_size() == n
assert hvd.is_initialized() and hvd.mpi_threads_supported() in (True, False)

def data(rank, shape, dtype, seed=0):
    rng = np.random.default_rng(1000 * seed + rank)
    return (rng.standard_normal(shape) * 4).astype(dtype)

DT = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8]
# all-reduce: every op and dtype, shapes incl. 0-d and empty
for i, dtype in enumerate(DT):
    for shape in [(), (0,), (5,), (3, 4, 2)]:
        for op, ref in [(hvd.Sum, np.sum), (hvd.Min, np.min), (hvd.Max, np.max),
                        (hvd.Product, np.prod), (hvd.Average, np.mean)]:
            if op is hvd.Product:
                ins = [np.full(shape, rr % 2 + 1, dtype) for rr in range(n)]
            else:
                ins = [data(rr, shape, dtype, i) for rr in range(n)]
            out = hvd.allreduce(ins[r], name=f"ar.{dtype.__name__}.{shape}.{op}", op=op)
            stacked = np.stack([x.astype(np.float64) for x in ins])
            expect = ref(stacked, axis=0)
            assert out.shape == ins[r].shape and out.dtype == ins[r].dtype, (out.shape, out.dtype)
            if op is hvd.Average and np.issubdtype(dtype, np.integer):
                # the sum wraps in the dtype, then the average truncates, as in Horovod
                expect = np.trunc(np.sum(np.stack(ins), axis=0, dtype=dtype) * (1.0 / n))
            tol = 1e-2 if dtype == np.float16 else 1e-5
            exact = op in (hvd.Min, hvd.Max) or np.issubdtype(dtype, np.integer)
            if op is hvd.Sum and np.issubdtype(dtype, np.integer):
                expect = np.sum(np.stack(ins), axis=0, dtype=dtype)  # same wrap-around
            if exact:
                np.testing.assert_array_equal(out, np.asarray(expect).astype(dtype))
            else:
                np.testing.assert_allclose(out.astype(np.float64), expect, rtol=tol, atol=tol)

# prescale / postscale, in-place output
x = data(r, (7,), np.float64, 1)
out = hvd.allreduce(x, name="scaled", op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
np.testing.assert_allclose(out, 1.5 * sum(data(rr, (7,), np.float64, 1) for rr in range(n)))
y = x.copy()
res = hvd.allreduce(y, name="inplace", op=hvd.Average, output=y)
assert res is y
np.testing.assert_allclose(y, np.mean([data(rr, (7,), np.float64, 1) for rr in range(n)], 0))
np.testing.assert_array_equal(x, data(r, (7,), np.float64, 1))  # input untouched

# async, submitted in a different order on every rank (no deadlock), fused
names = [f"async.{k}" for k in range(40)]
order = list(range(40))
random.Random(r).shuffle(order)
handles = {k: hvd.allreduce_async(np.full((k + 1,), r + k, np.float32), name=names[k],
                                  op=hvd.Sum) for k in order}
for k in range(40):
    out = hvd.synchronize(handles[k])
    assert hvd.poll(handles[k])
    np.testing.assert_allclose(out, np.full((k + 1,), sum(rr + k for rr in range(n))))

# grouped all-reduce
outs = hvd.grouped_allreduce([np.full(3, r, np.float32), np.full((2, 2), 2 * r, np.float32)],
                             name="grp", op=hvd.Sum)
assert isinstance(outs, list) and len(outs) == 2
np.testing.assert_allclose(outs[0], np.full(3, sum(range(n))))
np.testing.assert_allclose(outs[1], np.full((2, 2), 2 * sum(range(n))))

# allgather with a different first dimension per rank
for dtype in (np.float32, np.int64, np.bool_):
    mine = (np.arange((r + 1) * 3).reshape(r + 1, 3) + 10 * r).astype(dtype)
    g = hvd.allgather(mine, name=f"ag.{dtype.__name__}")
    expect = np.concatenate([(np.arange((rr + 1) * 3).reshape(rr + 1, 3) + 10 * rr).astype(dtype)
                             for rr in range(n)])
    np.testing.assert_array_equal(g, expect)
g = hvd.allgather(np.zeros((0, 2), np.float32) if r == 0 else np.ones((1, 2), np.float32),
                  name="ag.empty")
assert g.shape == (n - 1, 2)

# broadcast from every root, copy and in place
for root in range(n):
    b = hvd.broadcast(data(r, (4, 2), np.float32, 2), root, name=f"bc.{root}")
    np.testing.assert_array_equal(b, data(root, (4, 2), np.float32, 2))
z = np.full(5, r, np.int32)
hvd.broadcast(z, n - 1, name="bc.inplace", output=z)
assert (z == n - 1).all()

# alltoall with uneven splits (rank r sends j+1 rows to rank j) and even default
rows = [j + 1 for j in range(n)]
send = np.concatenate([np.full((rows[j], 2), 100 * r + j, np.float64) for j in range(n)])
out, received = hvd.alltoall(send, splits=rows, name="a2a")
assert list(received) == [r + 1] * n
expect = np.concatenate([np.full((r + 1, 2), 100 * src + r, np.float64) for src in range(n)])
np.testing.assert_array_equal(out, expect)
out, received = hvd.alltoall(np.arange(n * 3, dtype=np.int32).reshape(n, 3) + 1000 * r,
                             name="a2a.even")
np.testing.assert_array_equal(out, np.stack([np.arange(3) + 3 * r + 1000 * s for s in range(n)]))

# reducescatter: first rows % n ranks get one more row
for rows_total in (n, 2 * n + 1, 1):
    full = [data(rr, (rows_total, 3), np.float64, 3) for rr in range(n)]
    mine = hvd.reducescatter(full[r], name=f"rs.{rows_total}", op=hvd.Sum)
    base, extra = divmod(rows_total, n)
    start = r * base + min(r, extra)
    count = base + (1 if r < extra else 0)
    np.testing.assert_allclose(mine, sum(full)[start:start + count])
avg = hvd.reducescatter(np.full((n, 2), float(r)), name="rs.avg")
np.testing.assert_allclose(avg, np.full((1, 2), (n - 1) / 2))

# objects
assert hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=n - 1) == {
    "from": n - 1, "list": [n - 1] * 3}
assert hvd.allgather_object(("rank", r)) == [("rank", rr) for rr in range(n)]

# process sets: evens, and a set this rank may be outside of
evens = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
single = hvd.add_process_set([n - 1])
if evens.included():
    s = hvd.allreduce(np.array([float(r)]), name="ps.evens", op=hvd.Sum, process_set=evens)
    assert s[0] == sum(k for k in range(n) if k % 2 == 0)
    g = hvd.allgather(np.array([r]), name="ps.ag", process_set=evens)
    assert list(g) == [k for k in range(n) if k % 2 == 0]
    # the root is named by its world rank, as in Horovod
    b = hvd.broadcast(np.array([r]), evens.ranks[-1], name="ps.bc", process_set=evens)
    assert b[0] == max(k for k in range(n) if k % 2 == 0)
    hvd.barrier(process_set=evens)
if single.included():
    assert hvd.allreduce(np.array([5.0]), name="ps.single", process_set=single)[0] == 5.0
# the world keeps working around them
assert hvd.allreduce(np.array([1.0]), name="after.sets", op=hvd.Sum)[0] == n
assert hvd.remove_process_set(evens) and not hvd.remove_process_set(evens)
hvd.barrier()

# steady state: the same tensors repeated (served by the response cache) stay correct
for step in range(20):
    hs = [hvd.allreduce_async(np.full(10, step + r, np.float32), name=f"steady.{k}", op=hvd.Sum)
          for k in range(5)]
    for h in hs:
        np.testing.assert_allclose(hvd.synchronize(h), np.full(10, n * step + sum(range(n))))
assert hvd.bytes_sent() > 0
hvd.shutdown()
assert not hvd.is_initialized()
print(f"OK {r}", flush=True)
'''

JOIN_SCRIPT = r'''
import numpy as np
import dlcomm as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
steps = r + 2  # uneven data: rank r has r + 2 batches
for step in range(steps):
    out = hvd.allreduce(np.full(4, 1.0), name="grad", op=hvd.Average)
    # ranks still training contribute, joined ranks send zeros; averages divide by every
    # rank, as Horovod's
    active = sum(1 for k in range(n) if step < k + 2)
    np.testing.assert_allclose(out, np.full(4, active / n))
    s = hvd.allreduce(np.full(4, 1.0), name="count", op=hvd.Sum)
    assert s[0] == active, (step, s, active)
last = hvd.join()
assert last == n - 1, last
# after everyone joined, normal collectives work again
assert hvd.allreduce(np.array([1.0]), name="after", op=hvd.Sum)[0] == n
print(f"OK {r}", flush=True)
'''


@pytest.mark.parametrize("np_", [2, 4])
def test_every_op_against_numpy(np_, tmp_path):
    proc = run_mpi(np_, OPS_SCRIPT, tmp_path, timeout=240)
    assert proc.count_per_rank("OK") == [1] * np_, proc.report()


@pytest.mark.parametrize("algorithm", ["ring", "rhd", "ordered", "pipelined", "fastest"])
def test_engine_runs_dlcomm_allreduce_algorithms(algorithm, tmp_path):
    proc = run_mpi(3, OPS_SCRIPT, tmp_path, timeout=240,
                   env={"DLCOMM_ALLREDUCE_ALGORITHM": algorithm})
    assert proc.count_per_rank("OK") == [1] * 3, proc.report()


def test_single_rank_job(tmp_path):
    proc = run_mpi(1, OPS_SCRIPT, tmp_path, timeout=120)
    assert proc.count_per_rank("OK") == [1], proc.report()


@pytest.mark.parametrize("np_", [2, 3])
def test_join_with_uneven_data(np_, tmp_path):
    proc = run_mpi(np_, JOIN_SCRIPT, tmp_path, timeout=120)
    assert proc.count_per_rank("OK") == [1] * np_, proc.report()


TUNABLES_SCRIPT = r'''
import numpy as np
import dlcomm as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
engine = hvd.basics.state().engine
engine.set_tunables(1024, 0.5)  # collective: applied at the same point everywhere
assert engine.executor.fusion_threshold == 1024 and engine.config.cycle_time == 0.5
hs = [hvd.allreduce_async(np.full(100, float(r)), name=f"t{i}", op=hvd.Sum) for i in range(20)]
assert all((hvd.synchronize(h) == sum(range(n))).all() for h in hs)
try:
    engine.set_tunables(2048 + r, 0.5)
except hvd.MismatchError as exc:
    assert "arguments differs" in str(exc), exc
    print(f"OK {r}", flush=True)
'''


def test_tunables_change_everywhere_at_once(tmp_path):
    proc = run_mpi(3, TUNABLES_SCRIPT, tmp_path, timeout=120)
    assert proc.count_per_rank("OK") == [1] * 3, proc.report()


SPLITS_SCRIPT = r'''
import numpy as np
import dlcomm as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()


def data(rank, shape, dtype, seed):
    """Values spread over six decades, so the order of a float sum changes its last bits."""
    rng = np.random.default_rng([seed, rank])
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 3, shape)
    return (x * 1000).astype(dtype) if np.dtype(dtype).kind == "i" else x.astype(dtype)


def split(total):
    """Horovod's split of the first dimension: the first total % n ranks get one more row."""
    base, extra = divmod(total, n)
    return [base + (1 if k < extra else 0) for k in range(n)]


REF = {hvd.Sum: np.sum, hvd.Average: np.mean, hvd.Min: np.min, hvd.Max: np.max}
seed = 0
# Reduce-scatter, then all-gather of the parts, against the all-reduce of the same tensor:
# the same bits (the engine reduces every element in rank order, wherever the element sits),
# and both against a float64 reference. Sizes below the rank count leave ranks with no rows.
for total in sorted({1, max(n - 1, 1), n + 1, 2 * n + 1, 7, 1001}):
    for rest in ((), (3,)):
        for dtype in (np.float16, np.float32, np.float64, np.int32):
            for op in REF:
                if op is hvd.Average and dtype == np.int32:
                    continue  # integer averages truncate: covered by OPS_SCRIPT
                seed += 1
                case = f"rows={total} rest={rest} {np.dtype(dtype)} {op}"
                ins = [data(k, (total, *rest), dtype, seed) for k in range(n)]
                counts = split(total)
                start = sum(counts[:r])
                part = hvd.reducescatter(ins[r], name=f"rs.{seed}", op=op)
                assert part.shape == (counts[r], *rest) and part.dtype == dtype, (case, part.shape)
                expect = REF[op](np.stack([x.astype(np.float64) for x in ins]), axis=0)
                expect = expect[start:start + counts[r]]
                if np.dtype(dtype).kind == "i" or op in (hvd.Min, hvd.Max):
                    np.testing.assert_array_equal(part, expect.astype(dtype), err_msg=case)
                else:
                    scale = np.max(np.abs(np.stack(ins).astype(np.float64)), axis=0)
                    tol = 4 * n * np.finfo(dtype).eps * scale[start:start + counts[r]]
                    assert np.all(np.abs(part.astype(np.float64) - expect) <= tol), case
                whole = hvd.allgather(part, name=f"ag.{seed}")
                full = hvd.allreduce(ins[r], name=f"ar.{seed}", op=op)
                assert whole.shape == full.shape and whole.tobytes() == full.tobytes(), case

# Prescale and postscale: the same factors, the same bits.
x = data(r, (2 * n + 1, 5), np.float32, 999)
kw = dict(op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0)
whole = hvd.allgather(hvd.reducescatter(x, name="rs.scaled", **kw), name="ag.scaled")
assert whole.tobytes() == hvd.allreduce(x, name="ar.scaled", **kw).tobytes()

# Fused all-reduces (one buffer, each tensor at its own offset) against reduce-scatter +
# all-gather of each tensor alone: the same bits.
sizes = sorted({1, max(n - 1, 1), n + 1, 7, 1001, 40001})
tensors = [data(r, (s,), np.float32, 2000 + s) for s in sizes]
handles = [hvd.allreduce_async(t, name=f"fused.{i}", op=hvd.Average)
           for i, t in enumerate(tensors)]
fused = [hvd.synchronize(h) for h in handles]
grouped = hvd.grouped_allreduce(tensors, name="grouped", op=hvd.Average)
for i, t in enumerate(tensors):
    alone = hvd.allgather(hvd.reducescatter(t, name=f"rs.alone.{i}"), name=f"ag.alone.{i}")
    assert alone.tobytes() == fused[i].tobytes() == grouped[i].tobytes(), sizes[i]

# Uneven all-gathers: rank k contributes k % 3 rows (zero rows on some ranks).
mine = np.full((r % 3, 2), r, np.int64)
g = hvd.allgather(mine, name="ag.uneven")
np.testing.assert_array_equal(
    g, np.concatenate([np.full((k % 3, 2), k, np.int64) for k in range(n)]))
print(f"OK {r}", flush=True)
'''


@pytest.mark.parametrize("np_", [2, 3, 4, 5])
def test_split_collectives_on_uneven_sizes_match_the_allreduce_bit_for_bit(np_, tmp_path):
    """The engine's reduce-scatter and all-gather on sizes the rank count does not divide
    (and smaller than it): correct, and together bit-identical to the all-reduce."""
    proc = run_mpi(np_, SPLITS_SCRIPT, tmp_path, timeout=240)
    assert proc.count_per_rank("OK") == [1] * np_, proc.report()
