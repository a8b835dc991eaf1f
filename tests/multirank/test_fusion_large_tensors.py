"""A fusion group holding tensors of 4 MiB and more reduces those straight into their outputs
and packs only the rest: on real ranks the results keep the rank-order bits of an unfused
all-reduce, with average, prescale and postscale, whether zero, one or several small tensors
remain to pack; and the small ones go before the large ones (a bias all-reduced after its
weight would make every rank wait for the last one out of the large all-reduce)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import run_mpi

SCRIPT = r"""
import json, sys
import numpy as np
from mpi4py import MPI
import dlcomm
from dlcomm.engine.operations.allreduce import SOLO_TENSOR_BYTES

dlcomm.init()
comm = MPI.COMM_WORLD
r, p = comm.Get_rank(), comm.Get_size()
rng = np.random.default_rng(r)
big = SOLO_TENSOR_BYTES // 4 + 1001  # float32 elements: just over the solo size
failures = []
for case, sizes in {"big+2 small": [big, 3, 1000], "big+1 small": [7, big],
                    "2 big": [big, big + 5], "all small": [5, 6, 7]}.items():
    for op, pre, post in (("sum", 1.0, 1.0), ("average", 0.5, 3.0)):
        xs = [(rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(np.float32)
              for n in sizes]
        want = []
        for x in xs:  # rank order, in float32, then the scales as the engine applies them
            copies = comm.allgather(x * np.float32(pre) if pre != 1.0 else x)
            total = copies[0].copy()
            for c in copies[1:]:
                total += c
            scale = post / (p if op == "average" else 1)
            want.append(total * np.float32(scale) if scale != 1.0 else total)
        bufs = [x.copy() for x in xs]
        handles = [dlcomm.allreduce_async(b, name=f"{case}.{op}.{i}", output=b,
                                          op=dlcomm.Average if op == "average" else dlcomm.Sum,
                                          prescale_factor=pre, postscale_factor=post)
                   for i, b in enumerate(bufs)]
        for h in handles:
            h.wait()
        for i, (got, w) in enumerate(zip(bufs, want)):
            if not np.allclose(got, w, rtol=1e-6, atol=0):
                failures.append(f"{case} {op} tensor {i}: wrong values")
            elif pre == 1.0 and post == 1.0 and not np.array_equal(got, w):
                failures.append(f"{case} {op} tensor {i}: not the rank-order bits")
dlcomm.shutdown()
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(failures, f)
"""


@pytest.mark.parametrize("np_ranks", [2, 3])
def test_large_tensors_leave_the_fusion_buffer_with_the_same_results(np_ranks: int,
                                                                      tmp_path: Path) -> None:
    run_mpi(np_ranks, SCRIPT, tmp_path, timeout=180, args=[str(tmp_path)],
            env={"DLCOMM_TIMELINE": str(tmp_path / "timeline{rank}.json")})
    for rank in range(np_ranks):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == []
        # Each request's first "communicate" span, in the order they started on this rank.
        trace = json.loads((tmp_path / f"timeline{rank}.json").read_text())
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        rows = {e["tid"]: e["args"]["name"] for e in events  # a row per request
                if e.get("ph") == "M" and e.get("name") == "thread_name"}
        started: dict[str, float] = {}
        for e in events:
            if e.get("name") == "communicate" and e.get("ph") in ("B", "X"):
                started.setdefault(rows[e["tid"]], e["ts"])
        for op in ("sum", "average"):
            big, smalls = f"big+2 small.{op}.0", [f"big+2 small.{op}.{i}" for i in (1, 2)]
            assert all(started[s] < started[big] for s in smalls), (rank, op, started)
            assert started[f"big+1 small.{op}.0"] < started[f"big+1 small.{op}.1"]
