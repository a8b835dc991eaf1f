"""``DLCOMM_MPI_WAIT``: the data path's MPI collectives give the same bits whether they wait by
polling (the default) or in MPI's blocking calls, and a rank waiting by polling leaves the CPU
to the ranks it waits for."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import run_mpi

SAME_BITS = r"""
import hashlib, json, sys
import numpy as np
from mpi4py import MPI
from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.collectives.ordered import ordered_allreduce
from dlcomm.collectives.pipelined import pipelined_allreduce
from dlcomm.ops import ReduceOp

p, r = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
digests = {}
for mode in ("poll", "block"):
    comm = MPICommunicator(MPI.COMM_WORLD)
    assert comm.poll is True  # the default
    comm.poll = mode == "poll"
    rng = np.random.default_rng(r)
    h = hashlib.sha256()
    for n in (1, p + 1, 1001, 70001):  # smaller than, and not divisible by, the rank count
        for dtype in (np.float32, np.float16, np.int8):
            x = (rng.standard_normal(n) * 20).astype(dtype)
            out = np.empty_like(x)
            comm.allreduce(x, out, ReduceOp.SUM)  # MPI's own (blocking in both modes)
            h.update(out.tobytes())
        x = rng.standard_normal(n).astype(np.float32)
        # all-to-all and all-gather (ordered), request lists (pipelined)
        for algorithm in (ordered_allreduce, pipelined_allreduce):
            out = np.empty_like(x)
            algorithm(comm, x, out, ReduceOp.SUM)
            h.update(out.tobytes())
        counts = [n // p + (1 if i < n % p else 0) for i in range(p)]
        mine = np.empty(counts[r], np.float32)
        comm.reduce_scatter(x, mine, counts, ReduceOp.SUM)
        gathered = np.empty(n, np.float32)
        comm.allgatherv(mine, gathered, counts)  # unequal blocks; every rank's block
        h.update(gathered.tobytes())
        root = n % p
        b = x.copy() if r == root else np.zeros_like(x)
        comm.bcast(b, root)
        h.update(b.tobytes())
    comm.barrier()
    digests[mode] = h.hexdigest()
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(digests, f)
"""


@pytest.mark.parametrize("np_ranks", [2, 3, 4, 5])
def test_polling_and_blocking_waits_give_the_same_bits(np_ranks: int, tmp_path: Path) -> None:
    run_mpi(np_ranks, SAME_BITS, tmp_path, timeout=180, args=[str(tmp_path)])
    digests = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(np_ranks)]
    assert all(d["poll"] == d["block"] for d in digests), digests
    assert len({d["poll"] for d in digests}) == 1  # every rank holds the same results


WAITING = r"""
import json, sys, time
import numpy as np
from mpi4py import MPI
from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.ops import ReduceOp

from dlcomm.collectives.ordered import ordered_allreduce

comm = MPICommunicator(MPI.COMM_WORLD)
x = np.ones(1 << 16, np.float32)  # the all-to-all and all-gather of auto's MPI candidate
ordered_allreduce(comm, x, x.copy(), ReduceOp.SUM)  # connections made before the timed wait
comm.barrier()
if comm.rank == 1:
    time.sleep(0.6)  # the rank being waited for "computes"
cpu, wall = time.thread_time(), time.perf_counter()
ordered_allreduce(comm, x, x.copy(), ReduceOp.SUM)
cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
with open(f"{sys.argv[1]}/rank{comm.rank}.json", "w") as f:
    json.dump({"cpu": cpu, "wall": wall, "poll": comm.poll}, f)
"""


def test_a_rank_waiting_by_polling_leaves_the_cpu_free(tmp_path: Path) -> None:
    run_mpi(2, WAITING, tmp_path, timeout=120, args=[str(tmp_path)])
    waiting = json.loads((tmp_path / "rank0.json").read_text())
    assert waiting["poll"] is True
    assert waiting["wall"] >= 0.5  # it did wait for rank 1
    # Spinning in MPI_Alltoallv would spend about the whole wait on the CPU.
    assert waiting["cpu"] < 0.25 * waiting["wall"], waiting


def test_block_is_chosen_by_the_environment(tmp_path: Path) -> None:
    run_mpi(2, WAITING, tmp_path, timeout=120, args=[str(tmp_path)],
            env={"DLCOMM_MPI_WAIT": "block"})
    assert json.loads((tmp_path / "rank0.json").read_text())["poll"] is False


def test_a_bad_wait_mode_is_refused() -> None:
    from dlcomm.comm.mpi_backend import mpi_wait_mode

    assert mpi_wait_mode("Block") == "block"
    with pytest.raises(ValueError, match="mpi_wait must be one of poll, block"):
        mpi_wait_mode("spin")
