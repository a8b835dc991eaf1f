"""SampleCache on real ranks of one host: whatever shard each rank draws, a host loads every
sample from the source once; the next epoch reads every sample back from shared memory, and
the job's files are gone once every rank closed the cache."""
from __future__ import annotations

import json

import pytest
from mpi_run import run_mpi

SCRIPT = r"""
import json, sys
from pathlib import Path
import numpy as np
import dlcomm
from dlcomm.data import SampleCache

out, N = Path(sys.argv[1]), int(sys.argv[2])
dlcomm.init()
rank, size = dlcomm.rank(), dlcomm.size()
(out / "shm").mkdir(exist_ok=True)
cache = SampleCache("toy", memory_root=out / "shm", disk_dir=out / "disk",
                    memory_bytes=1 << 22, disk_bytes=0)

def load(i):
    return np.arange(i, i + 3, dtype=np.float64), f"label{i}"

report = {"epochs": [], "wrong": 0}
for epoch in range(3):
    shard = [i for i in range(N) if (i + epoch) % size == rank]  # a different shard each epoch
    for i in shard:
        x, label = cache.get(i, load)
        report["wrong"] += int(not (np.array_equal(x, load(i)[0]) and label == f"label{i}"))
    report["epochs"].append(cache.reset_stats().as_dict())
    dlcomm.barrier()  # the next epoch starts once every rank finished this one
report["memory_dir"] = str(cache.memory_dir)
cache.close()
dlcomm.barrier()
report["left_behind"] = Path(report["memory_dir"]).exists()
everyone = dlcomm.allgather_object(report)
if rank == 0:
    (out / "report.json").write_text(json.dumps(everyone))
"""


@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_a_host_loads_each_sample_once_then_reads_it_back(tmp_path, ranks: int) -> None:
    n = 47  # not a multiple of any rank count
    run_mpi(ranks, SCRIPT, tmp_path, timeout=180, args=[str(tmp_path), str(n)])
    reports = json.loads((tmp_path / "report.json").read_text())
    assert all(r["wrong"] == 0 for r in reports), reports
    first = [r["epochs"][0] for r in reports]
    assert sum(e["misses"] for e in first) == n  # every sample loaded once on the host
    for later in (1, 2):
        epochs = [r["epochs"][later] for r in reports]
        assert sum(e["misses"] for e in epochs) == 0
        assert sum(e["memory_hits"] for e in epochs) == n
    assert len({r["memory_dir"] for r in reports}) == 1  # one copy for the host
    assert not any(r["left_behind"] for r in reports)
