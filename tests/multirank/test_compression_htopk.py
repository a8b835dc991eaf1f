"""Hierarchical top-k (``htopk``) on real ranks grouped into pretend hosts
(``DLCOMM_HIERARCHICAL_RANKS_PER_HOST``): even and uneven hosts, tensors whose size the rank
count does not divide or that are smaller than it. Every rank must get bitwise the same
result, equal to the independent reference ``htopk_steps``; error feedback must conserve what
was not sent; ratio 1 must be the dense sum; the engine's path must equal the direct driver.
"""
from __future__ import annotations

import pytest
from mpi_run import run_mpi

SCRIPT = r'''
import os
import numpy as np
from mpi4py import MPI
from dlcomm.compression import MPICommAdapter, compressed_allreduce, get_compressor
from dlcomm.compression.exchange import run_rounds
from compression_reference import htopk_steps

world = MPI.COMM_WORLD
comm = MPICommAdapter(world)
P, rank = comm.size, comm.rank
per_host = int(os.environ["DLCOMM_HIERARCHICAL_RANKS_PER_HOST"]) or P
HOSTS = [list(range(lo, min(lo + per_host, P))) for lo in range(0, P, per_host)]
MY_HOST = rank // per_host


def grads(step, shape, dtype=np.float32, integer=False):
    rngs = [np.random.default_rng([q, step, 25]) for q in range(P)]
    if integer:
        return [r.integers(-8, 9, shape).astype(dtype) for r in rngs]
    return [r.standard_normal(shape).astype(dtype) for r in rngs]


def same_everywhere(label, arr):
    everyone = world.allgather(arr)
    assert all(o.dtype == arr.dtype and np.array_equal(o, everyone[0]) for o in everyone), \
        f"{label}: ranks disagree"


def build(spec):
    return get_compressor(spec, min_compress_size=0, compress_1d=True)


# Against the reference, several steps of error feedback, sizes the ranks do not divide.
for shape in [(24, 20), (7, 9), (3,), (1,)]:
    for ratio in (0.1, 0.34):
        c = build(f"htopk:ratio={ratio}")
        all_grads = [grads(step, shape) for step in range(4)]
        ref = htopk_steps(all_grads, ratio, HOSTS)
        old = np.zeros(shape, np.float32)
        sent_sum = np.zeros(shape, np.float64)
        for step, g in enumerate(all_grads):
            label = f"shape {shape} ratio {ratio} step {step}"
            out = compressed_allreduce(c, g[rank], "w", comm)
            same_everywhere(label, out)
            want, residuals, kept = ref[step]
            assert out.shape == shape and out.dtype == np.float32, label
            assert np.allclose(out, want, rtol=1e-5, atol=1e-5), \
                f"{label}: max diff {np.abs(out - want).max()}"
            union = np.unique(np.concatenate(kept))
            assert np.array_equal(np.flatnonzero(out), union), f"{label}: positions"
            # This rank's residual: exactly its g + old residual with its host's kept
            # positions zeroed (what it sent inside its host's sum), and the reference's.
            acc = (g[rank] + old).reshape(-1)
            new = c.residual("w")
            assert np.array_equal(new.reshape(-1), np.where(
                np.isin(np.arange(acc.size), kept[MY_HOST]), 0, acc)), f"{label}: residual"
            assert np.allclose(new.reshape(-1), residuals[rank], rtol=1e-5, atol=1e-5), label
            old = new.copy()
            sent_sum += out.astype(np.float64) * P
        # Conservation over the steps: what was sent plus what every rank still holds is
        # every rank's gradients of every step.
        held = np.sum(world.allgather(old.astype(np.float64)), axis=0)
        given = np.sum([np.sum(g, axis=0, dtype=np.float64) for g in all_grads], axis=0)
        assert np.allclose(sent_sum + held, given, rtol=1e-4, atol=1e-4), \
            f"conservation {shape} {ratio}: {np.abs(sent_sum + held - given).max()}"

# ratio 1 is the dense sum (integer values: every order of addition gives the same bits);
# nothing is left behind.
for shape in [(6, 7), (2,)]:
    c = build("htopk:ratio=1")
    for step in range(2):
        g = grads(step, shape, integer=True)
        out = compressed_allreduce(c, g[rank], "d", comm, average=False)
        assert np.array_equal(out, np.sum(g, axis=0)), f"ratio 1 {shape}"
        assert not np.any(c.residual("d")), "ratio 1 left a residual"
        out = compressed_allreduce(c, g[rank], "d", comm)
        assert np.array_equal(out, np.sum(g, axis=0) / np.float32(P)), f"ratio 1 mean {shape}"

# average=False is the sum; float64 works.
c = build("htopk:ratio=0.2")
g = grads(0, (9, 5), np.float64)
out = compressed_allreduce(c, g[rank], "s", comm, average=False)
same_everywhere("sum", out)
assert np.allclose(out, htopk_steps([g], 0.2, HOSTS)[0][0] * P, rtol=1e-9, atol=1e-9)

# Momentum correction (DGC masking at the host's selection): ranks still agree.
c = build("htopk:ratio=0.1")
c.set_momentum(0.9)
for step in range(3):
    out = compressed_allreduce(c, grads(step, (12, 10))[rank], "m", comm)
    same_everywhere(f"momentum step {step}", out)
    assert np.all(np.isfinite(out))

# Approximate selection: every rank still gets the same bits, and about k per shard of a
# host sum cross between hosts (the union of the hosts' selections is what is non-zero).
c = build("htopk:ratio=0.05,approx=1")
for step in range(2):
    out = compressed_allreduce(c, grads(step, (40, 31))[rank], "x", comm)
    same_everywhere(f"approx step {step}", out)
    kept = np.count_nonzero(out)
    assert 0 < kept <= len(HOSTS) * 1.25 * max(1, int(0.05 * 40 * 31)) + len(HOSTS) * 3, kept

# Several tensors in one run_rounds call, one of them bypassing compression (dense), others
# with HOST/PEER rounds, beside a flat topk tensor: the same as one at a time.
mixed = get_compressor("htopk:ratio=0.1", min_compress_size=20)
alone = get_compressor("htopk:ratio=0.1", min_compress_size=20)
flat, flat_alone = build("topk:ratio=0.1"), build("topk:ratio=0.1")
xs = [grads(0, s)[rank] for s in [(8, 6), (4, 4), (11, 3)]]
results = run_rounds([(mixed, xs[0], "a"), (mixed, xs[1], "b"), (flat, xs[2], "c"),
                      (mixed, xs[2], "d")], comm, True)
singles = [compressed_allreduce(alone, xs[0], "a", comm),
           compressed_allreduce(alone, xs[1], "b", comm),
           compressed_allreduce(flat_alone, xs[2], "c", comm),
           compressed_allreduce(alone, xs[2], "d", comm)]
for (value, summed), single in zip(results, singles):
    value = value / np.float32(P) if summed else value
    assert np.array_equal(value, single), "run_rounds of several tensors"
    same_everywhere("mixed", value)
print(f"OK {rank}", flush=True)
'''


@pytest.mark.parametrize("np_,per_host", [
    (2, 2),  # one host: a dense sum, then top-k of each shard of it
    (3, 2),  # 2 + 1: one shard, exchanged by the host leaders
    (4, 2),  # 2 + 2
    (5, 2),  # 2 + 2 + 1
    (5, 3),  # 3 + 2: two shards; the third rank of the first host owns none
    (4, 1),  # four hosts of one rank: flat top-k's traffic pattern
    (3, 0),  # the real shared-memory split: one host of three ranks, three shards
])
def test_htopk_on_pretend_hosts(np_, per_host, tmp_path):
    proc = run_mpi(np_, SCRIPT, tmp_path, timeout=180,
                   env={"DLCOMM_HIERARCHICAL_RANKS_PER_HOST": per_host})
    assert proc.count_per_rank("OK") == [1] * np_, proc.report()


ENGINE_SCRIPT = r'''
import numpy as np
import dlcomm as hvd
from mpi4py import MPI
from dlcomm.compression import MPICommAdapter, compressed_allreduce, get_compressor

hvd.init()
r = hvd.rank()
rng = np.random.default_rng(r)
xs = [rng.standard_normal(s).astype(np.float32) for s in [(64, 32), (10,), (37, 5)]]
ref_comm = MPICommAdapter(MPI.COMM_WORLD.Dup())
engine_c, ref_c = get_compressor("htopk:ratio=0.1"), get_compressor("htopk:ratio=0.1")
for step in range(3):
    hs = [hvd.allreduce_async(x, name=f"h.{k}", compression=engine_c) for k, x in enumerate(xs)]
    got = [hvd.synchronize(h) for h in hs]
    want = [compressed_allreduce(ref_c, x, f"h.{k}", ref_comm) for k, x in enumerate(xs)]
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), step
    everyone = hvd.allgather(np.concatenate([g.ravel() for g in got])[None], name="chk")
    assert all(np.array_equal(everyone[0], e) for e in everyone)
# dlcomm.bytes_sent() counts the host and peer rounds. On 2+2 every rank owns one of the two
# shards: the tensor (host reduce-scatter), 10% of a shard as int32 indices (host all-gather)
# and as float32 values + int32 indices (peer all-gather, packed in one message: a header of
# 5 int64 and each array padded to 8 bytes), the summed shard (host all-gather).
big = rng.standard_normal((128, 128)).astype(np.float32)
before = hvd.bytes_sent()
hvd.allreduce(big, name="h.big", compression=engine_c)
sent = hvd.bytes_sent() - before
shard = big.size // 2
picked = int(0.1 * shard) * 4
packed = 40 + 2 * (-(-picked // 8) * 8)
assert sent == big.nbytes + picked + packed + shard * 4, (sent, big.nbytes)
print(f"OK {r}", flush=True)
hvd.shutdown()
'''


def test_htopk_through_the_engine_equals_the_direct_driver(tmp_path):
    proc = run_mpi(4, ENGINE_SCRIPT, tmp_path, timeout=180,
                   env={"DLCOMM_HIERARCHICAL_RANKS_PER_HOST": 2})
    assert proc.count_per_rank("OK") == [1] * 4, proc.report()
