"""``dlcomm bench roundtrip``: a small all-reduce's latency with the ranks idle, and while a
compute thread runs beside it in every rank.

A data-parallel step overlaps its all-reduces with the backward pass, so they run while the
rank computes. When the rank's host has no core to spare (one core per emulated host with
``--pin-hosts``, or more busy threads than cores), the thread that must answer a message
competes with the computing thread for the core; a waiting rank that yields
(``--mca mpi_yield_when_idle 1``, which the emulated cluster sets) hands it the core until
the next scheduler tick. This measures that cost on its own:
the same ``MPI_Allreduce`` (blocking), in alternating rounds, with the ranks idle and with a
compute block (the demo CNN's forward+backward, or a matrix product) looping in a second
thread of every rank. ``--through engine`` times ``dlcomm.allreduce`` instead: a round of
the engine (its negotiation and its data path, with their polling waits), as a training
step's gradient pays it.

    dlcommrun --emulate 2x1gbit --pin-hosts dlcomm bench roundtrip [--through engine]
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dlcomm.tools.bench.arguments import count_arg
from dlcomm.tools.bench.corun import (
    add_block_arguments,
    block_description,
    make_block,
    require_kernel,
)

DEMO_FC2_BYTES = 5160  # the demo CNN's last layer (weight and bias), its first all-reduce


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Computing:
    """A thread running ``block`` in a loop until stopped (a rank's training computation)."""

    def __init__(self, block: Any) -> None:
        self._block = block
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="roundtrip-compute",
                                        daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._block()
        except BaseException as exc:  # reported by the caller after stop()
            self.error = exc

    def __enter__(self) -> _Computing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def mpi_allreduce(comm: Any) -> Callable[[np.ndarray], Any]:
    """A blocking ``MPI_Allreduce`` (sum, in place) on ``comm``."""
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    return lambda buf: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)


def engine_allreduce(buf: np.ndarray) -> Any:
    """``dlcomm.allreduce`` under one name (after the first, a response-cache hit, as a
    training step's gradient); needs ``dlcomm.init()``."""
    import dlcomm  # noqa: PLC0415 - the engine only for --through engine

    return dlcomm.allreduce(buf, name="roundtrip", op=dlcomm.Sum)


def time_allreduces(comm: Any, nbytes: int, iters: int, pause: float,
                    reduce: Callable[[np.ndarray], Any] | None = None) -> list[float]:
    """Seconds of ``iters`` blocking float32 all-reduces of ``nbytes`` (``reduce``; default
    MPI's), each started after a barrier and followed by ``pause`` seconds (as steps are
    spaced by computation)."""
    reduce = reduce or mpi_allreduce(comm)
    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    times = []
    for _ in range(iters):
        comm.Barrier()
        start = time.perf_counter()
        reduce(buf)
        times.append(time.perf_counter() - start)
        time.sleep(pause)
    return times


def measure(comm: Any, block: Any, nbytes: int, iters: int, rounds: int,
            pause: float = 0.005, settle: float = 0.2,
            reduce: Callable[[np.ndarray], Any] | None = None) -> list[dict[str, Any]]:
    """``rounds`` rounds of idle and busy (idle first in rounds 1, 3, ...); every rank
    returns the rows with each all-reduce's time as the slowest rank's. ``reduce``: the
    all-reduce timed (default MPI's). A compute block that fails on any rank raises the same
    RuntimeError on every rank."""
    rows = []
    for r in range(rounds):
        row: dict[str, Any] = {"round": r + 1}
        for state in (("idle", "busy") if r % 2 == 0 else ("busy", "idle")):
            error = None
            if state == "busy":
                with _Computing(block) as computing:
                    time.sleep(settle)  # the block is running before the first all-reduce
                    mine = time_allreduces(comm, nbytes, iters, pause, reduce)
                error = None if computing.error is None else repr(computing.error)
            else:
                mine = time_allreduces(comm, nbytes, iters, pause, reduce)
            gathered = comm.allgather((mine, error))
            failed = [(rank, e) for rank, (_, e) in enumerate(gathered) if e is not None]
            if failed:
                raise RuntimeError(f"the compute thread failed on rank {failed[0][0]}: "
                                   f"{failed[0][1]}")
            slowest = np.max(np.array([g[0] for g in gathered]), axis=0).tolist()
            row[state] = {"p10_ms": 1e3 * _percentile(slowest, 0.1),
                          "p50_ms": 1e3 * _percentile(slowest, 0.5),
                          "p90_ms": 1e3 * _percentile(slowest, 0.9)}
        row["ratio"] = row["busy"]["p50_ms"] / row["idle"]["p50_ms"]
        rows.append(row)
    return rows


def text_table(rows: list[dict[str, Any]]) -> str:
    """Rounds with median (p10-p90) ms idle and busy, the ratio of medians, and the median."""
    lines = ["| round | idle: ms, median (p10-p90) | computing: ms, median (p10-p90) | "
             "computing / idle |", "|---|---:|---:|---:|"]
    for r in rows:
        i, b = r["idle"], r["busy"]
        lines.append(f"| {r['round']} | {i['p50_ms']:.2f} ({i['p10_ms']:.2f}-{i['p90_ms']:.2f})"
                     f" | {b['p50_ms']:.2f} ({b['p10_ms']:.2f}-{b['p90_ms']:.2f}) | "
                     f"{r['ratio']:.1f}x |")
    lines.append(f"| median | {statistics.median(r['idle']['p50_ms'] for r in rows):.2f} | "
                 f"{statistics.median(r['busy']['p50_ms'] for r in rows):.2f} | "
                 f"**{statistics.median(r['ratio'] for r in rows):.1f}x** |")
    return "\n".join(lines) + "\n"


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench roundtrip``."""
    p = actions.add_parser(
        "roundtrip", help="a small all-reduce with the ranks idle against while they compute "
        "(run under dlcommrun; rank 0 prints)",
        description="Time a small blocking MPI_Allreduce with every rank idle and with a "
        "compute block looping in a second thread of every rank, in alternating rounds; "
        "each all-reduce's time is the slowest rank's.")
    p.add_argument("--bytes", type=count_arg(4), default=DEMO_FC2_BYTES,
                   help=f"message size (default {DEMO_FC2_BYTES}, the demo CNN's last layer)")
    add_block_arguments(p)
    p.add_argument("-n", "--iters", type=count_arg(2), default=50, metavar="N",
                   help="all-reduces per state and round (default 50)")
    p.add_argument("--rounds", type=count_arg(1), default=3, help="alternating rounds "
                   "(default 3)")
    p.add_argument("--through", choices=("mpi", "engine"), default="mpi",
                   help="mpi: a blocking MPI_Allreduce (default); engine: dlcomm.allreduce, "
                   "the engine's negotiation and data path")
    p.add_argument("--json", default=None, metavar="PATH", help="rank 0 writes the rounds here")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from mpi4py import MPI  # no dlcomm engine: only the measured all-reduces on the links

    require_kernel(args.kernel)
    comm = MPI.COMM_WORLD
    block = make_block(args.kernel, args.batch, args.size)
    if args.through == "engine":
        import dlcomm  # noqa: PLC0415 - the engine only for --through engine

        dlcomm.init()
        try:
            rows = measure(comm, block, args.bytes, args.iters, args.rounds,
                           reduce=engine_allreduce)
        finally:
            dlcomm.shutdown()
    else:
        rows = measure(comm, block, args.bytes, args.iters, args.rounds)
    if comm.rank == 0:
        through = "dlcomm.allreduce" if args.through == "engine" else "MPI_Allreduce"
        print(f"dlcomm bench roundtrip: {through} of {args.bytes} bytes, {comm.size} ranks, "
              f"compute block {block_description(args)}, {args.iters} all-reduces per state, "
              f"{args.rounds} rounds", flush=True)
        print(text_table(rows), end="", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0
