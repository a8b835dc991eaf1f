"""Times every all-reduce algorithm against ``mpi`` (MPI's own) on float32 buffers.

``python -m dlcomm.tools.bench.algorithms`` starts itself on ``--np`` ranks (default 4) through
``build_mpirun_command`` when it is not already running under MPI, then prints a markdown
table: per size and algorithm the median time over repeats (each repeat timed as the
slowest rank's time after a barrier; algorithms take turns within a repeat), nccl-tests
style algbw and busbw, and the time ratio to ``mpi`` measured in the same run (below 1
means faster than MPI's own).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Sequence

import numpy as np

from dlcomm.launcher.mpirun_command import build_mpirun_command

MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
DEFAULT_SIZES = ("4KiB", "1MiB", "16MiB", "64MiB")
UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "B": 1}


def parse_size(text: str) -> int:
    """Bytes in a size such as ``4KiB``, ``16MiB`` or ``4096``."""
    text = text.strip()
    for unit, factor in sorted(UNITS.items(), key=lambda item: -len(item[0])):
        if text.endswith(unit) and text[: -len(unit)].strip().isdigit():
            return int(text[: -len(unit)]) * factor
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"size {text!r} is not like 4KiB, 16MiB or 4096")


def format_size(nbytes: int) -> str:
    """The shortest exact binary-unit spelling of ``nbytes``."""
    for unit in ("GiB", "MiB", "KiB"):
        if nbytes % UNITS[unit] == 0:
            return f"{nbytes // UNITS[unit]} {unit}"
    return f"{nbytes} B"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options of the benchmark."""
    parser = argparse.ArgumentParser(
        prog="python -m dlcomm.tools.bench.algorithms", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--np", type=int, default=4, help="ranks to start (default 4)")
    parser.add_argument(
        "--sizes", type=parse_size, nargs="+", default=[parse_size(s) for s in DEFAULT_SIZES],
        help="buffer sizes in bytes of float32 (default 4KiB 1MiB 16MiB 64MiB)",
    )
    parser.add_argument(
        "--repeats", type=int, default=0,
        help="timed repeats per size and algorithm (default: 50 below 1 MiB, 20 up to "
             "16 MiB, 10 above)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    parser.add_argument(
        "--ranks-per-host", type=int, default=2,
        help="group size of the emulated-hosts hierarchical variant (default 2)",
    )
    args = parser.parse_args(argv)
    if args.np < 1:
        parser.error("--np must be >= 1")
    if args.repeats < 0 or args.warmup < 0:
        parser.error("--repeats and --warmup must be >= 0")
    if args.ranks_per_host < 1:
        parser.error("--ranks-per-host must be >= 1")
    return args


def repeats_for(nbytes: int, requested: int) -> int:
    """Timed repeats for a size: the requested count, or fewer for big buffers."""
    if requested:
        return requested
    return 50 if nbytes < 2**20 else 20 if nbytes <= 16 * 2**20 else 10


def running_under_mpi() -> bool:
    """True when this process was started by mpirun (one rank of a job)."""
    return any(name in os.environ for name in MPI_RANK_VARIABLES)


def launch(argv: Sequence[str], np: int) -> int:
    """Start this module on ``np`` ranks and return mpirun's exit code.

    The environment is passed explicitly from ``os.environ``: importing ``dlcomm`` may have
    initialised MPI as a singleton in this process, which adds Open MPI variables to the
    C-level environment that would make the child mpirun fail silently.
    """
    env = dict(os.environ)
    command = build_mpirun_command(
        np, [sys.executable, "-m", "dlcomm.tools.bench.algorithms", *argv], env=env
    )
    print("#", " ".join(command), flush=True)
    return subprocess.call(command, env=env)


def time_algorithms(
    comm, algorithms: dict[str, Callable], buf, repeats: int, warmup: int
) -> dict[str, float]:
    """Median over repeats of the slowest rank's time for one in-place all-reduce, seconds.

    Algorithms take turns inside each repeat (round robin), so a burst of load from other
    processes on a shared machine hits all of them alike instead of one.
    """
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    for algorithm in algorithms.values():
        for _ in range(warmup):
            algorithm(comm, buf, buf, "sum")
    times = np.empty((repeats, len(algorithms)))
    for repeat in range(repeats):
        for column, algorithm in enumerate(algorithms.values()):
            comm.Barrier()
            start = MPI.Wtime()
            algorithm(comm, buf, buf, "sum")
            times[repeat, column] = MPI.Wtime() - start
    slowest = np.empty_like(times)
    comm.Allreduce(times, slowest, op=MPI.MAX)
    return dict(zip(algorithms, np.median(slowest, axis=0).tolist()))


def run_benchmark(args: argparse.Namespace) -> None:
    """Time every algorithm on every size and print the table from rank 0."""
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    # MPI start-up: the collectives load the transport.
    from dlcomm.collectives import HierarchicalAllreduce, get_allreduce_algorithm

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    hosts = HierarchicalAllreduce(comm, hierarchical_leader_algorithm="ring")
    emulated = HierarchicalAllreduce(
        comm,
        hierarchical_leader_algorithm="ring",
        hierarchical_ranks_per_host=args.ranks_per_host,
    )
    algorithms: dict[str, Callable] = {
        name: get_allreduce_algorithm(name)
        for name in ("mpi", "ordered", "ordered_tcp", "pipelined", "auto", "ring", "rhd", "tree")
    }
    algorithms[f"hierarchical ({hosts.host_count} host)"] = lambda c, s, r, op: hosts(s, r, op)
    algorithms[f"hierarchical ({args.ranks_per_host} ranks/host)"] = (
        lambda c, s, r, op: emulated(s, r, op)
    )
    rows = []
    for nbytes in args.sizes:
        # Zeros stay zero under repeated in-place sums (ones would overflow to inf).
        buf = np.zeros(nbytes // 4, dtype=np.float32)
        repeats = repeats_for(nbytes, args.repeats)
        medians = time_algorithms(comm, algorithms, buf, repeats, args.warmup)
        mpi_time = medians["mpi"]
        for name, seconds in medians.items():
            algbw = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
            busbw = algbw * 2 * (size - 1) / size
            rows.append((format_size(nbytes), name, seconds * 1e3, algbw, busbw,
                         seconds / mpi_time, repeats))
    if comm.Get_rank() == 0:
        print(f"all-reduce, float32, sum, in place, {size} ranks, median of repeats "
              f"(slowest rank per repeat)")
        print("| size | algorithm | median ms | algbw GB/s | busbw GB/s | time / mpi "
              "| repeats |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        for row in rows:
            print("| {} | {} | {:.3f} | {:.3f} | {:.3f} | {:.2f} | {} |".format(*row))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: relaunch under mpirun when needed, else benchmark on this job's ranks."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if not running_under_mpi():
        return launch(argv, args.np)
    run_benchmark(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
