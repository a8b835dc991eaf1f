"""Multi-rank tests: compressed_allreduce over MPICommAdapter on 2, 3 and 4 real ranks.

Every rank checks that all ranks got bitwise-identical results and that they equal the
single-process lockstep simulation of the same algorithm (``simulate``) and, where one exists,
an independent numpy reference (dense sums, gTop-k's dense tree, PowerSGD/ACP-SGD maths).
"""
from __future__ import annotations

import pytest
from mpi_run import run_mpi

SCRIPT = r'''
import numpy as np
from mpi4py import MPI
from dlcomm.compression import MPICommAdapter, compressed_allreduce, get_compressor
from compression_reference import (
    ALL_SPECS, acpsgd_steps, gtopk_steps, powersgd_step0, signum_vote, simulate,
)

world = MPI.COMM_WORLD
comm = MPICommAdapter(world)
P, rank = comm.size, comm.rank
SHAPE = (24, 20)


def grads(step, dtype=np.float32, shape=SHAPE):
    return [np.random.default_rng([q, step, 11]).standard_normal(shape).astype(dtype)
            for q in range(P)]


def check(label, out, expected, tol):
    everyone = world.allgather(out)
    assert all(o.dtype == out.dtype and np.array_equal(o, everyone[0]) for o in everyone), \
        f"{label}: ranks disagree"
    assert out.shape == expected.shape and out.dtype == expected.dtype, f"{label}: shape/dtype"
    assert np.allclose(out, expected, rtol=tol, atol=tol), \
        f"{label}: max diff {np.abs(out - expected).max()}"


def run(spec, steps=3, dtype=np.float32, shape=SHAPE, **kw):
    mine = get_compressor(spec, min_compress_size=0, **kw)
    sims = [get_compressor(spec, min_compress_size=0, **kw) for _ in range(P)]
    outs = []
    for step in range(steps):
        g = grads(step, dtype, shape)
        out = compressed_allreduce(mine, g[rank], "w", comm)
        tol = 2e-2 if ("fp16" in spec or dtype == np.float16) else 1e-5
        check(f"{spec} step {step}", out, simulate(sims, g, "w"), tol)
        outs.append(out)
    return outs


for spec in ALL_SPECS:
    run(spec)

# Independent references.
for dtype in (np.float32, np.float64, np.float16):
    g = grads(0, dtype)
    dense = np.sum(np.array(g, dtype=np.float64), axis=0) / P
    tol = 2e-2 if dtype == np.float16 else 1e-5
    check(f"none {dtype}", run("none", 1, dtype)[0], dense.astype(dtype), tol)
    check(f"fp16 {dtype}", run("fp16", 1, dtype)[0], dense.astype(dtype), 2e-2)
for step, (out, ref) in enumerate(zip(run("gtopk:ratio=0.05"),
                                      gtopk_steps([grads(s) for s in range(3)], 0.05))):
    assert np.array_equal(np.flatnonzero(out), np.flatnonzero(ref)), f"gtopk indices {step}"
    check(f"gtopk ref step {step}", out, ref.astype(np.float32), 1e-5)
check("powersgd ref", run("powersgd:rank=3,ef=0", 1, np.float64)[0],
      powersgd_step0(grads(0, np.float64), 3, "w"), 1e-9)
acp_refs = acpsgd_steps([grads(s, np.float64) for s in range(3)], 3, "w")
for step, (out, ref) in enumerate(zip(run("acpsgd:rank=3,ef=0", 3, np.float64), acp_refs)):
    check(f"acpsgd ref step {step}", out, ref, 1e-9)
check("signum vote", run("signum", 1)[0], signum_vote(grads(0)).astype(np.float32), 0)

# Bypass: small and 1-D tensors go dense, float16 included (a user-defined MPI sum).
for shape, dtype in (((5, 5), np.float32), ((3000,), np.float16)):
    c = get_compressor("topk:ratio=0.01")
    g = grads(0, dtype, shape)
    out = compressed_allreduce(c, g[rank], "b", comm, average=False)
    check(f"bypass {shape}", out, np.sum(np.array(g, np.float64), axis=0).astype(dtype),
          2e-2 if dtype == np.float16 else 1e-5)
    assert c.residual("b") is None
comm.free()
print(f"RANK {rank} OK", flush=True)
'''


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_compressed_allreduce_on_real_ranks(np_, tmp_path):
    proc = run_mpi(np_, SCRIPT, tmp_path, timeout=120)
    assert proc.count_per_rank(" OK") == [1] * np_, proc.report()
