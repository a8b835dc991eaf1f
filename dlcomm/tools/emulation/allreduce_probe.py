"""Raw mpi4py Allreduce busbw, one JSON line per size from rank 0 (run by ``emulate_check``).

``python -m dlcomm.tools.emulation.allreduce_probe SIZE_BYTES... [--iters N] [--warmup N]``
under mpirun. Reports nccl-tests' figures: algbw = bytes / time, busbw = algbw * 2(n-1)/n,
with the median time over iterations (each timed across a barrier, max over ranks), and
checks the result against the known sum so a fast but wrong run cannot pass.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    """Measure float32 SUM Allreduce for each size; rank 0 prints one JSON line per size."""
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sizes", nargs="+", type=int, help="message sizes in bytes")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or any(s < 4 for s in args.sizes):
        parser.error("need iters >= 1, warmup >= 0 and sizes of at least 4 bytes")
    comm = MPI.COMM_WORLD
    n = comm.size
    hosts = comm.gather(socket.gethostname(), root=0)
    if comm.rank == 0:
        print(json.dumps({"ranks": n, "hosts": sorted(set(hosts))}), flush=True)
    for size in args.sizes:
        count = size // 4
        send = np.full(count, comm.rank + 1, dtype=np.float32)
        recv = np.empty_like(send)
        times = []
        for i in range(args.warmup + args.iters):
            comm.Barrier()
            start = time.perf_counter()
            comm.Allreduce(send, recv, op=MPI.SUM)
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if i >= args.warmup:
                times.append(elapsed)
        expected = n * (n + 1) / 2
        correct = comm.allreduce(bool(np.all(recv == np.float32(expected))), op=MPI.LAND)
        seconds = float(np.median(times))
        algbw = count * 4 / seconds
        if comm.rank == 0:
            print(json.dumps({
                "bytes": count * 4, "seconds": seconds, "algbw_bytes_per_s": algbw,
                "busbw_bytes_per_s": algbw * 2 * (n - 1) / n, "correct": correct,
            }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
