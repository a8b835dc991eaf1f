"""Raw throughput of dlcomm's TCP mesh in two patterns, as a fraction of a 1 Gbit/s link.

A ring stream (each rank sends MiB to its right neighbour) and an all-to-all stream (a third
to each peer on 4 ranks), as one message or in 1 MiB messages. Run under
``dlcommrun -np 4 --emulate 4x1gbit python mesh_patterns.py 24``; ``-x SNDBUF=bytes`` and
``-x CC=cubic`` override the connections' send buffer and congestion control.
"""
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

from dlcomm.comm.tcp_mesh import TcpMesh
from dlcomm.comm.world import world_communicator

LINK = 0.125e9
SEGMENT = 1 << 20

comm = world_communicator()
mesh = TcpMesh(comm, send_buffer=int(os.environ.get("SNDBUF", "0")))
for conn in mesh._conns.values():
    if os.environ.get("CC"):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, os.environ["CC"].encode())
rank, size = comm.rank, comm.size
nbytes = (int(sys.argv[1]) if len(sys.argv) > 1 else 24) << 20
right, left = (rank + 1) % size, (rank - 1) % size
peers = [p for p in range(size) if p != rank]
part = nbytes // (size - 1)
src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)


def timed(run) -> float:
    times = []
    for _ in range(4):
        MPI.COMM_WORLD.Barrier()
        t0 = time.perf_counter()
        run()
        MPI.COMM_WORLD.Barrier()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def pieces(lo: int, hi: int) -> list[tuple[int, int]]:
    return [(i, min(i + SEGMENT, hi)) for i in range(lo, hi, SEGMENT)]


def ring_one() -> None:
    mesh.start([(right, src)], [(left, dst)]).wait()


def ring_segments() -> None:
    mesh.start([(right, src[a:b]) for a, b in pieces(0, nbytes)],
               [(left, dst[a:b]) for a, b in pieces(0, nbytes)]).wait()


def all_to_all_one() -> None:
    mesh.start([(p, src[:part]) for p in peers],
               [(p, dst[j * part:(j + 1) * part]) for j, p in enumerate(peers)]).wait()


def all_to_all_segments() -> None:
    mesh.start([(p, src[a:b]) for a, b in pieces(0, part) for p in peers],
               [(p, dst[j * part + a:j * part + b]) for a, b in pieces(0, part)
                for j, p in enumerate(peers)]).wait()


res = {"ring 1 msg": nbytes / timed(ring_one) / LINK,
       "ring 1MiB msgs": nbytes / timed(ring_segments) / LINK,
       "a2a 1 msg": part * (size - 1) / timed(all_to_all_one) / LINK,
       "a2a 1MiB msgs": part * (size - 1) / timed(all_to_all_segments) / LINK}
everyone = comm.allgather(res)
if rank == 0:
    for key in res:
        print(f"{key:16s}", " ".join(f"{r[key]:.3f}" for r in everyone))
mesh.close()
