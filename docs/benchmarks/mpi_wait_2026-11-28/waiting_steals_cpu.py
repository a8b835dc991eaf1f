"""Do ranks waiting in an all-reduce slow the ranks still computing?

Run under ``dlcommrun -np 4 --emulate 4x1gbit python waiting_steals_cpu.py`` (4 ranks, this
machine's 2 cores). Each round, the first half of the ranks computes a fixed numpy workload
and then joins an all-reduce of 256 KiB that the other half entered at once and waits in.
The three ways of waiting take turns round by round: ``ordered`` over MPI with the data
path's polling wait (``DLCOMM_MPI_WAIT=poll``, the default), the same with MPI's blocking
calls (``block``), and ``ordered_tcp`` over the TCP mesh. Rank 0 prints the computing ranks'
median compute time per way, and the same workload on an otherwise idle rank.
"""
import statistics
import time

import numpy as np
from mpi4py import MPI

from dlcomm.collectives.ordered import ordered_allreduce, ordered_tcp_allreduce
from dlcomm.comm.mpi_backend import MPICommunicator
from dlcomm.ops import ReduceOp

ROUNDS = 9
world = MPI.COMM_WORLD
polling, blocking = MPICommunicator(world), MPICommunicator(world)
polling.poll, blocking.poll = True, False
ways = {"MPI, poll": (polling, ordered_allreduce),
        "MPI, block": (blocking, ordered_allreduce),
        "TCP mesh": (polling, ordered_tcp_allreduce)}
computing = world.Get_rank() < world.Get_size() // 2
a0 = np.random.default_rng(0).random((300, 300))
buf = np.zeros((256 << 10) // 4, np.float32)


def work() -> float:
    a, t = a0, time.perf_counter()
    for _ in range(40):
        a = np.tanh(a @ a * 1e-3)
    return time.perf_counter() - t


for comm, algorithm in ways.values():  # connections and the mesh made before timing
    algorithm(comm, buf, buf, ReduceOp.SUM)
times = {name: [] for name in ways}
for _ in range(ROUNDS):
    for name, (comm, algorithm) in ways.items():
        polling.barrier()
        if computing:
            times[name].append(work())
        algorithm(comm, buf, buf, ReduceOp.SUM)
polling.barrier()
medians = {name: statistics.median(t) * 1e3 for name, t in times.items() if t}
gathered = world.gather(medians, root=0)
if world.Get_rank() == 0:
    print(f"{world.Get_size()} ranks; compute time of the computing ranks (median of "
          f"{ROUNDS} rounds, ms) while the other ranks wait:")
    for name in ways:
        values = [g[name] for g in gathered if name in g]
        print(f"  {name:11s} " + "  ".join(f"{v:6.1f}" for v in values))
