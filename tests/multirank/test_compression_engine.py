"""Compressed all-reduces through the engine: fused (summable) and unfused paths equal the
per-tensor reference driver, results agree on every rank, and the timeline shows phases."""
import json

import pytest
from mpi_run import run_mpi

SCRIPT = r'''
import json, sys
import numpy as np
import dlcomm as hvd
from mpi4py import MPI
from dlcomm.compression import MPICommAdapter, compressed_allreduce, get_compressor

hvd.init()
r, n = hvd.rank(), hvd.size()
rng = np.random.default_rng(r)
xs = [rng.standard_normal(s).astype(np.float32) for s in [(64, 32), (10,), (128, 16), (3, 3, 8)]]
ref_comm = MPICommAdapter(MPI.COMM_WORLD.Dup())
SPECS = ["powersgd:rank=4", "acpsgd:rank=4", "fp16", "powersgd:rank=2+fp16", "randomk:ratio=0.3",
         "topk:ratio=0.2", "gtopk:ratio=0.2", "efsignsgd", "qsgd:levels=4",
         "powersgd:rank=4,mc=0,start_iter=2", "topk:ratio=0.2,start_iter=1"]
for spec in SPECS:
    engine_c, ref_c = get_compressor(spec), get_compressor(spec)
    for step in range(3):  # several steps: error feedback and warm starts carry state
        hs = [hvd.allreduce_async(x, name=f"{spec}.{k}", compression=engine_c)
              for k, x in enumerate(xs)]
        got = [hvd.synchronize(h) for h in hs]
        want = [compressed_allreduce(ref_c, x, f"{spec}.{k}", ref_comm) for k, x in enumerate(xs)]
        tol = 2e-3 if "fp16" in spec else 1e-5
        for a, b in zip(got, want):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol * float(np.abs(b).max()))
        if "start_iter=2" in spec and step < 2:  # DDP's warm-up: the plain average
            for k, (a, x) in enumerate(zip(got, xs)):
                dense = hvd.allreduce(x, name=f"dense.{spec}.{step}.{k}")
                np.testing.assert_allclose(a, dense, rtol=1e-6, atol=1e-6)
        everyone = hvd.allgather(np.concatenate([g.ravel() for g in got])[None], name="chk")
        assert all(np.array_equal(everyone[0], e) for e in everyone), spec
# bytes_sent counts compressed payloads: topk at 1% sends a small fraction of dense bytes
before = hvd.bytes_sent()
big = rng.standard_normal((256, 256)).astype(np.float32)
hvd.allreduce(big, name="dense.big")
dense_bytes = hvd.bytes_sent() - before
before = hvd.bytes_sent()
hvd.allreduce(big, name="topk.big", compression=get_compressor("topk:ratio=0.01"))
topk_bytes = hvd.bytes_sent() - before
assert dense_bytes == big.nbytes, dense_bytes
assert 0 < topk_bytes < 0.05 * dense_bytes, (topk_bytes, dense_bytes)
print(f"OK {r}", flush=True)
hvd.shutdown()
'''


def test_compressed_allreduce_through_engine_equals_reference(tmp_path):
    timeline = tmp_path / "tl-{rank}.json"
    proc = run_mpi(3, SCRIPT, tmp_path, timeout=240, env={"DLCOMM_TIMELINE": str(timeline)})
    assert proc.count_per_rank("OK") == [1] * 3, proc.report()
    events = json.loads((tmp_path / "tl-0.json").read_text())
    phases = {e.get("name") for e in events}
    assert {"compress", "decompress", "communicate"} <= phases, phases
    # tensor by tensor (all-gather rounds) too: the compress and decompress inside communicate
    rows = {e["tid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and "name" in e.get("args", {})}
    topk = {e["name"] for e in events
            if e.get("ph") == "X" and rows.get(e["tid"], "").startswith("topk:ratio=0.2.")}
    assert {"compress", "decompress", "communicate"} <= topk, topk


BATCH_SCRIPT = r'''
import numpy as np
import dlcomm as hvd
from mpi4py import MPI
from dlcomm.compression import MPICommAdapter, compressed_allreduce, get_compressor
from dlcomm.compression.base import ALLREDUCE

hvd.init()
r, n = hvd.rank(), hvd.size()
rng = np.random.default_rng(10 + r)
# uneven sizes (none divisible by the rank counts); 1-D and small tensors go dense
shapes = [(37, 29), (29,), (53, 23), (11,), (7, 5, 3)]
ref_comm = MPICommAdapter(MPI.COMM_WORLD.Dup())
for spec in ["topk:ratio=0.1,approx=1", "gtopk:ratio=0.1", "randomk:ratio=0.2", "efsignsgd"]:
    engine_c, ref_c = get_compressor(spec), get_compressor(spec)
    for step in range(3):
        xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        got = hvd.synchronize(hvd.grouped_allreduce_async(xs, name=f"g.{spec}",
                                                          compression=engine_c))
        want = [compressed_allreduce(ref_c, x, f"g.{spec}.{k}", ref_comm)
                for k, x in enumerate(xs)]
        for k, (a, b) in enumerate(zip(got, want)):
            assert a.shape == b.shape and a.dtype == b.dtype, (spec, k)
            if ALLREDUCE in ref_c.rounds or not ref_c.applies_to(xs[k]):
                # sums: one fused sum against one per tensor may round differently
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
            else:  # the same gathered payloads: the same bits
                assert np.array_equal(a, b), (spec, k, float(np.abs(a - b).max()))
        everyone = hvd.allgather(np.concatenate([g.ravel() for g in got])[None], name="chk")
        assert all(np.array_equal(everyone[0], e) for e in everyone), spec
print(f"OK {r}", flush=True)
hvd.shutdown()
'''


@pytest.mark.parametrize("np_", [2, 3, 4, 5])
def test_a_group_of_compressed_tensors_equals_one_exchange_per_tensor(np_, tmp_path):
    """The engine runs a group's all-gather rounds as one packed all-gather and its dense
    tensors as one fused sum: the results are those of the per-tensor driver."""
    proc = run_mpi(np_, BATCH_SCRIPT, tmp_path, timeout=240)
    assert proc.count_per_rank("OK") == [1] * np_, proc.report()
