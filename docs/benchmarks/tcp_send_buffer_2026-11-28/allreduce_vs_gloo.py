"""dlcomm's all-reduce against gloo's (torch.distributed) on the same ranks, alternating.

Run under ``dlcommrun -np 4 --emulate 4x1gbit python allreduce_vs_gloo.py 4 16 25 64``
(sizes in MiB); rank 0 prints the median time and busbw as a fraction of the 1 Gbit/s link.
"""
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import dlcomm.torch as hvd

LINK = 0.125e9  # bytes/s of 1 Gbit/s
REPEATS = 5  # per peer and size; the first is dropped

hvd.init()
rank, size = hvd.rank(), hvd.size()
dist.init_process_group("gloo", init_method="tcp://198.18.0.1:29533", rank=rank,
                        world_size=size)
results = {}
for mib in [int(s) for s in (sys.argv[1:] or [4, 16, 25, 64])]:
    n = mib * (1 << 20) // 4
    t = torch.ones(n)
    times: dict[str, list[float]] = {"dlcomm": [], "gloo": []}
    for rep in range(REPEATS):
        for who in ("dlcomm", "gloo") if rep % 2 == 0 else ("gloo", "dlcomm"):
            hvd.allreduce(torch.ones(1), op=hvd.Sum, name="sync")
            t0 = time.perf_counter()
            if who == "gloo":
                dist.all_reduce(t)
            else:
                hvd.allreduce_(t, op=hvd.Sum, name=f"t{mib}")
            times[who].append(time.perf_counter() - t0)
    for who, ts in times.items():
        median = float(np.median(ts[1:]))
        busbw = 2 * (size - 1) / size * n * 4 / median
        results[f"{mib}MiB {who}"] = (median * 1e3, busbw / LINK)
if rank == 0:
    for key, (ms, share) in results.items():
        print(f"{key} ms {ms:.1f}  busbw/link {share:.3f}")
hvd.allreduce(torch.ones(1), op=hvd.Sum, name="sync")
dist.barrier()
dist.destroy_process_group()
