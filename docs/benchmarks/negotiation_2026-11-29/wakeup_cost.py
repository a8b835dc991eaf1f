"""What one wake-up of a polling wait costs in CPU: a thread sleeps for a fixed delay, then
tests a pending MPI receive (as ``dlcomm.comm.polling.wait_polling`` does between sleeps),
for one second per delay; rank 0 prints wake-ups, process CPU time and CPU per wake-up.

    dlcommrun -np 2 --emulate 2x1gbit python docs/benchmarks/negotiation_2026-11-29/wakeup_cost.py
"""
import resource
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
never = np.zeros(1)
request = comm.Irecv(never, source=MPI.ANY_SOURCE, tag=77)  # nobody sends it
for delay in (1e-5, 5e-5, 2e-4, 1e-3):
    before, start, wakeups = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0
    while time.perf_counter() - start < 1.0:
        time.sleep(delay)
        request.Test()
        wakeups += 1
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if comm.rank == 0:
        print(f"sleep {delay * 1e6:5.0f} us: {wakeups:6d} wake-ups/s, CPU {cpu * 1e3:4.0f} ms/s, "
              f"{cpu / wakeups * 1e6:5.1f} us per wake-up", flush=True)
comm.Barrier()
request.Cancel()
