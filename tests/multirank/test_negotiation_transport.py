"""``DLCOMM_NEGOTIATION``: the engine negotiates over MPI or over the TCP mesh with the same
results, ``auto`` picks the mesh where ranks outnumber the cores and span several hosts, and a
rank waiting for a late peer over the mesh spends no CPU on the wait."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import run_mpi

TRAINING_LIKE = r"""
import hashlib, json, os, socket, sys
import numpy as np
if os.environ.get("PRETEND_HOSTS"):  # one pretend host per rank, all on this machine
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    socket.gethostname = lambda: f"pretend-host-{rank}"
import dlcomm
from dlcomm import runtime
from dlcomm.comm.machine import crowded_across_hosts
from dlcomm.comm.mesh_communicator import MeshCommunicator

dlcomm.init()
r, p = dlcomm.rank(), dlcomm.size()
control = runtime.state().engine.control
h = hashlib.sha256()
rng = np.random.default_rng(r)
for step in range(3):  # the second and third steps hit the response cache
    handles = []
    for i, n in enumerate((1, p + 1, 1001, 70001)):  # sizes not divisible by the ranks
        x = rng.standard_normal(n).astype(np.float32)
        handles.append(dlcomm.allreduce_async(x, name=f"grad.{i}", op=dlcomm.Sum))
    for handle in handles:
        h.update(np.asarray(dlcomm.synchronize(handle)).tobytes())
    rows = rng.standard_normal((r + 1, 3)).astype(np.float32)  # uneven all-gather
    h.update(np.asarray(dlcomm.allgather(rows, name=f"rows.{step}")).tobytes())
    b = np.full(5, float(r), np.float32)
    h.update(np.asarray(dlcomm.broadcast(b, root_rank=p - 1, name=f"b.{step}")).tobytes())
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump({"digest": h.hexdigest(), "mesh": isinstance(control, MeshCommunicator),
               "crowded": crowded_across_hosts(runtime.state().comm)}, f)
dlcomm.shutdown()
"""


def _ranks(tmp_path: Path, np_ranks: int) -> list[dict]:
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(np_ranks)]


@pytest.mark.parametrize("np_ranks", [2, 3, 4, 5])
def test_mpi_and_tcp_negotiation_give_the_same_results(np_ranks: int, tmp_path: Path) -> None:
    found = {}
    for transport in ("mpi", "tcp"):
        out = tmp_path / transport
        out.mkdir()
        run_mpi(np_ranks, TRAINING_LIKE, out, timeout=180, args=[str(out)],
                env={"DLCOMM_NEGOTIATION": transport})
        ranks = _ranks(out, np_ranks)
        assert all(rank["mesh"] == (transport == "tcp") for rank in ranks), ranks
        assert len({rank["digest"] for rank in ranks}) == 1  # every rank agrees
        found[transport] = ranks[0]["digest"]
    assert found["mpi"] == found["tcp"]


@pytest.mark.parametrize("pretend_hosts, extra_ranks, mesh", [
    (True, 1, True),  # more ranks than cores, on several hosts: the emulated cluster
    (False, 1, False),  # more ranks than cores on one host: MPI's shared memory
    (True, 0, False),  # a core per rank
])
def test_auto_negotiates_over_the_mesh_where_crowded_ranks_span_hosts(
        pretend_hosts: bool, extra_ranks: int, mesh: bool, tmp_path: Path) -> None:
    from dlcomm.comm.machine import local_core_count

    np_ranks = local_core_count() + extra_ranks
    if np_ranks < 2:
        pytest.skip("needs 2 ranks")
    env = {"DLCOMM_NEGOTIATION": "auto"}
    if pretend_hosts:
        env["PRETEND_HOSTS"] = "1"
    run_mpi(np_ranks, TRAINING_LIKE, tmp_path, timeout=180, args=[str(tmp_path)], env=env)
    ranks = _ranks(tmp_path, np_ranks)
    assert all(rank["crowded"] == mesh and rank["mesh"] == mesh for rank in ranks), ranks
    assert len({rank["digest"] for rank in ranks}) == 1


CONFLICT = r"""
import sys
import dlcomm
try:
    dlcomm.init()
except ValueError as exc:
    print("REFUSED:", exc)
    sys.exit(0)
print("STARTED")
"""


def test_tcp_negotiation_without_the_mesh_is_refused_on_every_rank(tmp_path: Path) -> None:
    run = run_mpi(3, CONFLICT, tmp_path, timeout=120,
                  env={"DLCOMM_NEGOTIATION": "tcp", "DLCOMM_TCP_MESH": "off"})
    assert run.count_per_rank("REFUSED:") == [1, 1, 1], run.rank_stdout
    assert all("DLCOMM_TCP_MESH=off" in out for out in run.rank_stdout), run.rank_stdout


WAITING = r"""
import json, sys, time
import numpy as np
from mpi4py import MPI
from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.comm.mesh_communicator import mesh_communicator

comm = mesh_communicator(MPICommunicator(MPI.COMM_WORLD.Dup()))
words = np.full(2, np.uint64(2**64 - 1))
comm.iallreduce_band(words)  # connections warm before the timed wait
if comm.rank == 1:
    time.sleep(0.6)  # the rank being waited for "computes"
    words[0] = np.uint64(6)
cpu, wall = time.thread_time(), time.perf_counter()
request = comm.iallreduce_band(words)
cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
with open(f"{sys.argv[1]}/rank{comm.rank}.json", "w") as f:
    json.dump({"cpu": cpu, "wall": wall, "done": request.test(),
               "words": [int(w) for w in words],
               "blobs": [b.decode() for b in comm.allgather_bytes(b"x" * comm.rank)]}, f)
"""


def test_waiting_for_a_late_rank_over_the_mesh_sleeps(tmp_path: Path) -> None:
    run_mpi(3, WAITING, tmp_path, timeout=120, args=[str(tmp_path)])
    ranks = _ranks(tmp_path, 3)
    assert all(rank["done"] and rank["words"] == [6, 2**64 - 1] for rank in ranks), ranks
    assert all(rank["blobs"] == ["", "x", "xx"] for rank in ranks), ranks
    waiting = ranks[0]
    assert waiting["wall"] >= 0.5  # it did wait for rank 1
    assert waiting["cpu"] < 0.05 * waiting["wall"], waiting  # blocked in the kernel
