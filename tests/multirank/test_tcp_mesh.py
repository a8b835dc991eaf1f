"""The TCP mesh on real ranks: all-to-all and all-gather with uneven and zero counts equal
MPI's byte for byte on 2-5 ranks, over MPI's communicator and the elastic jobs' TCP one, and
``ordered_tcp``'s segmented pipeline gives ``ordered``'s bits (one job per rank count);
``DLCOMM_TCP_MESH=off``, or one rank without a usable address, leaves every rank on MPI and
a bad value is refused; a rank that closes its connections makes the others fail with an
error naming it, not hang."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import run_mpi

EXCHANGES = r"""
import itertools, json, sys
import numpy as np
from mpi4py import MPI
from dlcomm.collectives import get_allreduce_algorithm
from dlcomm.collectives import ordered as ordered_module
from dlcomm.comm.mesh_communicator import mesh_communicator
from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.comm.tcp_communicator import TcpCommunicator
from dlcomm.comm.tcp_mesh import TcpMesh

comm = MPICommunicator(MPI.COMM_WORLD)
p, r = comm.size, comm.rank
# MPI's collectives over the mesh (MeshCommunicator), and the elastic jobs' communicator
# that has no MPI at all (TcpCommunicator): both must equal MPI byte for byte.
over_mesh = [("mesh", mesh_communicator(comm)), ("tcp", TcpCommunicator(TcpMesh(comm)))]
failures = []
rng = np.random.default_rng(r)
count_lists = [[3] * p, [(3 * i + 1) % 5 for i in range(p)], [0] * p,
               [0] * (p - 1) + [100_003], [1000 + 7 * i for i in range(p)]]
for (label, mesh), counts, dtype in itertools.product(
        over_mesh, count_lists, (np.float16, np.float32, np.int64)):
    mine = rng.integers(-100, 100, counts[r]).astype(dtype)
    want = np.empty(sum(counts), dtype)
    comm.allgatherv(mine, want, counts)
    got = np.full_like(want, 7)
    mesh.allgatherv(mine, got, counts)
    if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
        failures.append(f"{label} allgatherv counts={counts} {np.dtype(dtype)}")
    # all-to-all: rank r sends counts[(r + j) % p] elements to rank j
    send_counts = [counts[(r + j) % p] for j in range(p)]
    recv_counts = [counts[(j + r) % p] for j in range(p)]
    send = rng.integers(-100, 100, sum(send_counts)).astype(dtype)
    want = np.empty(sum(recv_counts), dtype)
    comm.alltoallv(send, send_counts, want, recv_counts)
    got = np.full_like(want, 7)
    mesh.alltoallv(send, send_counts, got, recv_counts)
    if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
        failures.append(f"{label} alltoallv counts={counts} {np.dtype(dtype)}")

# --- the send buffer: 128 KiB by default, as set; Linux reports twice the value set --------
import socket
for label, mesh, want_bytes in (("default", over_mesh[0][1].mesh, 128 << 10),
                                ("64k", TcpMesh(comm, send_buffer="64k"), 64 << 10)):
    got_bytes = {c.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) for c in mesh._conns.values()}
    if got_bytes != {2 * want_bytes}:
        failures.append(f"SO_SNDBUF {label}: {got_bytes}")

# --- ordered_tcp's segmented pipeline equals ordered over MPI byte for byte ---------------
ordered_module.MESH_SEGMENT_BYTES = MESH_SEGMENT_BYTES = 1024  # many segments, small buffers
world = MPI.COMM_WORLD
ordered, ordered_tcp = (get_allreduce_algorithm(n) for n in ("ordered", "ordered_tcp"))
# Blocks of about 2.5 segments (uneven: not divisible by the rank count), and of 17 segments
# (more than the cap of 16), in float32 and float16, out of place and in place.
for dtype, n in ((np.float32, int(2.5 * MESH_SEGMENT_BYTES / 4) * p + 7),
                 (np.float16, 17 * MESH_SEGMENT_BYTES // 2 * p + 3)):
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(dtype)
    want = np.empty_like(x)
    ordered(world, x, want, "sum")
    got = np.full_like(x, 7)
    ordered_tcp(world, x, got, "sum")
    if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
        failures.append(f"ordered_tcp out of place n={n} {np.dtype(dtype)}")
    inplace = x.copy()
    ordered_tcp(world, inplace, inplace, "max")
    ordered(world, x, want, "max")
    if not np.array_equal(inplace.view(np.uint8), want.view(np.uint8)):
        failures.append(f"ordered_tcp in place max n={n} {np.dtype(dtype)}")
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(failures, f)
"""


def _runs_without_failures(np_ranks: int, script: str, tmp_path: Path) -> None:
    """Run a script that writes its list of failures per rank; every list must be empty."""
    run_mpi(np_ranks, script, tmp_path, timeout=180, args=[str(tmp_path)])
    for rank in range(np_ranks):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [], rank


@pytest.mark.parametrize("np_ranks", [2, 3, 4, 5])
def test_mesh_exchanges_equal_mpi(np_ranks: int, tmp_path: Path) -> None:
    _runs_without_failures(np_ranks, EXCHANGES, tmp_path)


SETTINGS = r"""
import json, sys
from mpi4py import MPI
from dlcomm.comm.mesh_communicator import mesh_communicator
from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.comm.tcp_mesh import TcpMesh

comm = MPICommunicator(MPI.COMM_WORLD)
out = {"off": mesh_communicator(comm, {"DLCOMM_TCP_MESH": "off"}) is None,
       "self": mesh_communicator(MPICommunicator(MPI.COMM_SELF)) is None}
# Rank 1 finds no address (no interface in that subnet): every rank stays on MPI, none hangs.
nowhere = {"OMPI_MCA_btl_tcp_if_include": "203.0.113.0/24"} if comm.rank == 1 else {}
out["no_address"] = mesh_communicator(MPICommunicator(MPI.COMM_WORLD.Dup()), nowhere) is None
try:
    mesh_communicator(comm, {"DLCOMM_TCP_MESH": "yes"})
except ValueError as exc:
    out["bad"] = str(exc)
# A bad send buffer on rank 2 only: every rank raises, naming rank 2 (none waits).
try:
    TcpMesh(comm, {"DLCOMM_TCP_MESH_SEND_BUFFER": "lots"} if comm.rank == 2 else {})
except ValueError as exc:
    out["bad_buffer"] = str(exc)
with open(f"{sys.argv[1]}/rank{comm.rank}.json", "w") as f:
    json.dump(out, f)
"""


def test_off_bad_values_and_a_rank_without_address(tmp_path: Path) -> None:
    run_mpi(3, SETTINGS, tmp_path, timeout=60, args=[str(tmp_path)])
    for rank in range(3):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["off"] and out["self"] and out["no_address"]
        assert "DLCOMM_TCP_MESH must be 'auto' or 'off', got 'yes'" in out["bad"]
        assert out["bad_buffer"] == ("rank 2: DLCOMM_TCP_MESH_SEND_BUFFER must be a byte count "
                                     ">= 0 such as 131072 or 128k, got 'lots'")


PEER_GONE = r"""
import json, sys
import numpy as np
from mpi4py import MPI
from dlcomm.comm.mesh_communicator import mesh_communicator
from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.comm.tcp_mesh import MeshError

comm = MPICommunicator(MPI.COMM_WORLD)
mesh = mesh_communicator(comm)
comm.barrier()
error = None
if comm.rank == 1:
    mesh.free()  # closes its connections: the others are mid-exchange with it
else:
    buf = np.zeros(1 << 20, np.float32)
    try:
        mesh.allgatherv(buf[:1000], np.empty(1000 * comm.size, np.float32), [1000] * comm.size)
    except MeshError as exc:
        error = str(exc)
with open(f"{sys.argv[1]}/rank{comm.rank}.json", "w") as f:
    json.dump(error, f)
"""


def test_a_peer_that_closes_gives_an_error_not_a_hang(tmp_path: Path) -> None:
    run_mpi(3, PEER_GONE, tmp_path, timeout=60, args=[str(tmp_path)])
    for rank in (0, 2):
        error = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert error is not None and "rank 1 closed its TCP connection" in error




