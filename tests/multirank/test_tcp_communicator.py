"""The MPI-free TCP communicator on real ranks (1-5): every operation equals
``MPICommunicator``'s (all-reduce values close for floats, equal for integers, and the
same bits as the ``ordered`` algorithm on every rank), with uneven, tiny and zero sizes; the
features that need MPI raise on every rank; and a rank that closes its mesh makes the
others' all-reduce raise ``PeerLostError`` instead of hanging."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import run_mpi

EVERY_OPERATION = r"""
import hashlib, json, sys, traceback
import numpy as np
from mpi4py import MPI
from dlcomm.collectives import get_allreduce_algorithm
from dlcomm.collectives.ordered import ordered_reduce_scatter
from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.comm.tcp_communicator import TcpCommunicator, UnsupportedInElasticError
from dlcomm.comm.tcp_mesh import TcpMesh
from dlcomm.errors import DLCommError, PeerLostError
from dlcomm.ops import ReduceOp

mpi = MPICommunicator(MPI.COMM_WORLD)
p, r = mpi.size, mpi.rank
tc = TcpCommunicator(TcpMesh(mpi))
ordered = get_allreduce_algorithm("ordered")
rng = np.random.default_rng(1000 + r)
failures = []
results = {}  # all-reduce results' hashes, compared between ranks once at the end
TOL = {np.float16: 4e-3, np.float32: 1e-6, np.float64: 1e-14}  # times the magnitudes


def check(ok, what):
    if not ok:
        failures.append(what)


def same_bits(a, b):
    return a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def data(n, dtype, op):
    if np.issubdtype(dtype, np.floating):
        if op is ReduceOp.PRODUCT:
            return rng.uniform(0.5, 1.5, n).astype(dtype)
        return (rng.standard_normal(n) * 10.0 ** rng.integers(-2, 3, n)).astype(dtype)
    return rng.integers(1, 3, n).astype(dtype) if op is ReduceOp.PRODUCT else \
        rng.integers(-100, 100, n).astype(dtype)


try:
    # --- all-reduce: every op, dtype, size (both code paths), in place and out of place --
    for n in sorted({0, 1, 2, max(p - 1, 0), 7, 85_002}):
        for dtype in (np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8):
            for op in ReduceOp:
                if op is ReduceOp.ADASUM:
                    continue
                what = f"allreduce n={n} {np.dtype(dtype)} {op!r}"
                x = data(n, dtype, op)
                want = np.empty_like(x)
                mpi.allreduce(x, want, op)
                got = np.full_like(x, 7)
                tc.allreduce(x, got, op)
                if dtype in TOL:  # sums in another order: off by rounding errors only
                    scale = np.abs(x.astype(np.float64))
                    mpi.allreduce(scale, scale, ReduceOp.SUM)
                    error = np.abs(got.astype(np.float64) - want)
                    check(bool(np.all(error <= TOL[dtype] * (scale + np.abs(want)))), what)
                    ref = np.empty_like(x)
                    ordered(MPI.COMM_WORLD, x, ref,
                            "sum" if op is ReduceOp.AVERAGE else op.value)
                    check(n == 0 or same_bits(got, ref), what + " != ordered's bits")
                else:
                    check(same_bits(got, want), what)
                results[what] = hashlib.sha256(got.tobytes()).hexdigest()
                inplace = x.copy()
                tc.allreduce(inplace, inplace, op)
                check(same_bits(inplace, got), what + " in place")

    everyone = mpi.allgather(results)
    for what, digest in results.items():
        check(all(theirs[what] == digest for theirs in everyone), what + " differs between ranks")

    # --- reduce-scatter with uneven and zero counts (all-gather and all-to-all: the
    # mesh test, tests/multirank/test_tcp_mesh.py, checks them on both communicators) ----
    count_lists = [[3] * p, [(3 * i + 1) % 5 for i in range(p)], [0] * p,
                   [0] * (p - 1) + [100_003], [1000 + 7 * i for i in range(p)]]
    for counts in count_lists:
        # reduce-scatter: MPI's values, ordered's bits
        for op in (ReduceOp.SUM, ReduceOp.MAX):
            send = data(sum(counts), np.float32, op)
            want = np.empty(counts[r], np.float32)
            mpi.reduce_scatter(send, want, counts, op)
            got = np.full_like(want, 7)
            tc.reduce_scatter(send, got, counts, op)
            ref = np.empty_like(want)
            ordered_reduce_scatter(MPI.COMM_WORLD, send, ref, counts, op.value)
            what = f"reduce_scatter {counts} {op!r}"
            check(np.allclose(got, want, rtol=1e-5, atol=1e-5), what)
            check(same_bits(got, ref), what + " != ordered's bits")

    # --- broadcast from every root ----------------------------------------------------------
    for root in range(p):
        for n in (0, 5, 100_003):
            buf = rng.standard_normal(n).astype(np.float32)
            buf *= r == root
            want = buf.copy()
            mpi.bcast(want, root)
            tc.bcast(buf, root)
            check(same_bits(buf, want), f"bcast root={root} n={n}")
        obj = {"root": root, "items": list(range(root * 10))} if r == root else None
        check(tc.bcast_object(obj, root) == mpi.bcast_object(obj, root), f"bcast_object {root}")

    # --- control path -------------------------------------------------------------------------
    payload = bytes([r]) * (3 * r) + (b"x" * 200_000 if r == p - 1 else b"")
    check(tc.allgather_bytes(payload) == mpi.allgather_bytes(payload), "allgather_bytes")
    check(tc.allgather_bytes(b"") == [b""] * p, "allgather_bytes empty")
    value = ("x", r, [r] * r)
    check(tc.allgather(value) == mpi.allgather(value), "allgather objects")
    arr = np.arange(3 * r, dtype=np.float32) + r
    got, want = tc.allgather(arr), mpi.allgather(arr)
    check(len(got) == p and all(same_bits(a, b) for a, b in zip(got, want)), "allgather arrays")
    got[r][...] = -1
    check(same_bits(arr, np.arange(3 * r, dtype=np.float32) + r), "allgather aliases arr")
    words = np.array([np.iinfo(np.uint64).max ^ (1 << r), rng.integers(0, 2**62)], np.uint64)
    want = words.copy()
    request = mpi.iallreduce_band(want)
    while not request.test():
        pass
    check(tc.iallreduce_band(words).test() and same_bits(words, want), "iallreduce_band")
    x = data(1000, np.float64, ReduceOp.SUM)
    check(np.allclose(tc.allreduce_sum(x), mpi.allreduce_sum(x)), "allreduce_sum")
    got, want = np.empty_like(x), np.empty_like(x)
    check(tc.iallreduce(x, got, ReduceOp.MAX).test(), "iallreduce test")
    mpi.allreduce(x, want, ReduceOp.MAX)
    check(same_bits(got, want), "iallreduce")
    gathered = np.empty(2 * p, np.int64)
    tc.iallgather(np.array([r, -r], np.int64), gathered)
    check(gathered.tolist() == [v for i in range(p) for v in (i, -i)], "iallgather")
    tc.barrier()
    check(tc.ibarrier().test(), "ibarrier")
    check(tc.test_all([tc.ibarrier()]) and tc.request_list().wait_some() == [], "requests")

    # --- point-to-point -------------------------------------------------------------------------
    peer = r + 1 if r % 2 == 0 else r - 1
    if peer < p:
        got = tc.sendrecv(np.arange(r + 1, dtype=np.int32), peer)
        check(got.dtype == np.int32 and got.tolist() == list(range(peer + 1)), "sendrecv")
    for bad in (r, p, -1):
        try:
            tc.sendrecv(np.zeros(1), bad)
            failures.append(f"sendrecv to {bad} did not raise")
        except ValueError:
            pass
    ring = np.empty(4, np.int64)
    tc.sendrecv_into(np.full(4, r, np.int64), (r + 1) % p, ring, (r - 1) % p, 0)
    check(ring.tolist() == [(r - 1) % p] * 4, "sendrecv_into ring")
    if p >= 2:
        if r == 0:
            tc.send(np.arange(5, dtype=np.float64), 1, 0)
        elif r == 1:
            got = np.empty(5, np.float64)
            tc.recv(got, 0, 0)
            check(got.tolist() == list(range(5)), "send/recv")

    # --- communicators, caches, unsupported features ----------------------------------------------
    check(tc.plain is tc and tc.with_algorithm(object()).plain is not tc, "plain")
    check(tc.peek_cached("k") is None and tc.cached("k", lambda: 5) == 5, "cached")
    check(tc.with_algorithm(None).peek_cached("k") == 5, "with_algorithm shares the cache")
    dup = tc.dup()
    check(dup.peek_cached("k") is None, "dup has its own cache")
    y = np.full(10, r + 1, np.int64)
    dup.allreduce(y, y, ReduceOp.SUM)
    check(y.tolist() == [p * (p + 1) // 2] * 10, "dup allreduce")
    check(tc.split(None, r) is None, "split all None")
    whole = tc.split(0, r)
    z = np.full(3, r, np.int32)
    whole.allreduce(z, z, ReduceOp.MAX)
    check(z.tolist() == [p - 1] * 3, "split view allreduce")
    whole.free()
    check(whole.freed and not tc.freed and not dup.freed, "freeing a split view")
    tc.barrier()
    for args in ((r % 2, r), (0, -r)) if p >= 2 else ():
        try:
            tc.split(*args)
            failures.append(f"split{args} did not raise")
        except UnsupportedInElasticError as exc:
            check("elastic" in str(exc) and isinstance(exc, DLCommError), "split message")
    for call in (lambda: tc.isend(np.zeros(1), 0, 0), lambda: tc.irecv(np.zeros(1), 0, 0),
                 lambda: tc.split_by_host(r), lambda: tc.poll_object(0),
                 lambda: tc.isend_object(1, 0, 0)):
        try:
            call()
            failures.append("an unsupported call did not raise")
        except NotImplementedError as exc:
            check("elastic" in str(exc), f"unsupported message: {exc}")
    tc.barrier()
    dup.free()
    check(tc.freed and dup.freed, "freeing a dup closes the mesh for every view")
    tc.free()
    try:
        tc.barrier()
        failures.append("a freed communicator worked")
    except PeerLostError:
        failures.append("a freed communicator raised PeerLostError")
    except DLCommError as exc:
        check("freed" in str(exc), f"freed message: {exc}")
except Exception:
    failures.append(traceback.format_exc())
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(failures, f)
"""


@pytest.mark.parametrize("np_ranks", [1, 2, 3, 4, 5])
def test_every_operation_equals_mpi(np_ranks: int, tmp_path: Path) -> None:
    run_mpi(np_ranks, EVERY_OPERATION, tmp_path, timeout=180, args=[str(tmp_path)])
    for rank in range(np_ranks):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [], rank


PEER_LOST = r"""
import json, sys
import numpy as np
from mpi4py import MPI
from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.comm.tcp_communicator import TcpCommunicator
from dlcomm.comm.tcp_mesh import TcpMesh
from dlcomm.ops import ReduceOp

mpi = MPICommunicator(MPI.COMM_WORLD)
tc = TcpCommunicator(TcpMesh(mpi))
buf = np.ones(1 << 20, np.float32)
tc.allreduce(buf, buf, ReduceOp.SUM)
mpi.barrier()
out = {"first": float(buf[0])}
if mpi.rank == 2:
    tc.free()  # closes its connections while the others all-reduce with it
else:
    for step in ("during", "after"):
        try:
            tc.allreduce(buf, buf, ReduceOp.SUM)
            out[step] = None
        except Exception as exc:
            out[step] = [type(exc).__name__, str(exc)]
    out["freed"] = tc.freed
with open(f"{sys.argv[1]}/rank{mpi.rank}.json", "w") as f:
    json.dump(out, f)
"""


def test_a_lost_peer_raises_peer_lost_error_not_a_hang(tmp_path: Path) -> None:
    run_mpi(3, PEER_LOST, tmp_path, timeout=60, args=[str(tmp_path)])
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["first"] == 3.0
        assert out["during"][0] == "PeerLostError" and "rank 2" in out["during"][1], out
        assert out["after"][0] == "PeerLostError", out  # the mesh is closed: fails at once
        assert out["freed"]
