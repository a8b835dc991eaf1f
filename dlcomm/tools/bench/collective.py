"""``dlcomm bench allreduce|allgather|reducescatter|broadcast|alltoall``: bandwidth per size.

Run on every rank (``dlcommrun -np 4 dlcomm bench allreduce -b 4K -e 64M -f 4``). For each
size, dlcomm's collective and the raw mpi4py call on the same buffers are timed in
alternating blocks (dlcomm's engine stopped during the raw peer's blocks; each iteration
between barriers, slowest rank per iteration, median over iterations), their results are
checked against a numpy reference, and rank 0 prints one row as nccl-tests does: size, time,
algbw, busbw, check, for both peers, and the ratio.
"""
from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from dlcomm.tools.bench.isolation import EngineSwitch
from dlcomm.tools.bench.machine import describe_machine, load_average
from dlcomm.tools.bench.peers import check_op_dtype, make_case, results_match
from dlcomm.tools.bench.plot import plot_busbw
from dlcomm.tools.bench.table import format_header, format_row, write_json
from dlcomm.tools.bench.timing import check_counts, summarize_times, time_in_blocks
from dlcomm.tools.bench.units import algbw, busbw
from dlcomm.tools.emulation.plan import parse_spec

DLCOMM = "dlcomm"
RAW = "mpi4py"


@dataclass
class CollectiveOptions:
    """What to measure: one collective over a list of sizes."""

    collective: str
    sizes: list[int]
    warmup: int = 3
    iters: int = 20
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    block: int = 5  # iterations per block; peers alternate block by block
    argv: list[str] = field(default_factory=list)  # the command line, recorded in results

    def validate(self) -> None:
        """Raise ValueError/TypeError for anything that cannot be measured."""
        check_op_dtype(self.collective, self.op, self.dtype)
        check_counts(self.warmup, self.iters)
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
            raise ValueError(f"block must be a positive int, got {self.block!r}")
        if not self.sizes:
            raise ValueError("no sizes to measure")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in self.sizes):
            raise ValueError(f"sizes must be positive ints, got {self.sizes}")


def link_gbps(emulate: str | None) -> float | None:
    """The emulated link's rate in GB/s (each host, each way) for a ``DLCOMM_EMULATE`` value
    such as ``4x1gbit``; None off the emulated cluster."""
    if not emulate:
        return None
    return parse_spec(emulate).rate_bits / 8e9


def _peer_figures(collective: str, nbytes: int, ranks: int, times: np.ndarray,
                  ok: bool, link: float | None = None) -> dict[str, Any]:
    stats = summarize_times(times)
    median = stats["median_s"]
    figures = {**stats, "algbw_GBps": algbw(nbytes, median),
               "busbw_GBps": busbw(collective, nbytes, median, ranks),
               "check": "OK" if ok else "FAIL"}
    if link:
        # The distance to the physical limit: a ring-like collective cannot beat the link.
        figures["busbw_of_link"] = figures["busbw_GBps"] / link
    return figures


def measure_size(opts: CollectiveOptions, nbytes: int, comm: Any,
                 switch: EngineSwitch, link: float | None = None) -> dict[str, Any]:
    """One row: both peers timed and checked at ``nbytes``; identical on every rank."""
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    case = make_case(opts.collective, nbytes, opts.dtype, opts.op, comm, root=opts.root)
    ops = [case.run_dlcomm] + ([case.run_raw] if case.run_raw is not None else [])
    enter = [switch.start, switch.stop][:len(ops)]
    times = time_in_blocks(ops, comm, opts.warmup, opts.iters, opts.block, enter)
    switch.start()
    oks = []
    for op in ops:  # a fresh, untimed call per peer, into cleared outputs
        case.reset()
        oks.append(results_match(op(), case.expected))
    all_ok = np.array(oks, dtype=np.int32)
    comm.Allreduce(MPI.IN_PLACE, all_ok, op=MPI.MIN)  # one FAIL anywhere fails the row
    n = comm.Get_size()
    row: dict[str, Any] = {
        "bytes": case.nbytes, "count": case.count, "dtype": case.dtype.name,
        DLCOMM: _peer_figures(opts.collective, case.nbytes, n, times[0], bool(all_ok[0]),
                              link),
    }
    if case.run_raw is not None:
        row[RAW] = _peer_figures(opts.collective, case.nbytes, n, times[1], bool(all_ok[1]),
                                 link)
        row["ratio"] = row[DLCOMM]["median_s"] / row[RAW]["median_s"]
        # Median of per-iteration ratios: iteration i of each peer ran in neighbouring
        # blocks, so this pairs them under nearly the same load (robust on a shared machine).
        row["ratio_paired"] = float(np.median(times[0] / times[1]))
    else:
        row[RAW] = {"unavailable": case.raw_unavailable}
        row["ratio"] = row["ratio_paired"] = None
    return row


def timing_text(block: int, raw_peer_engine: str) -> str:
    """How the times were taken, for the header of a table."""
    engine = ("dlcomm's engine stopped during the raw peer's blocks" if raw_peer_engine ==
              "stopped" else "dlcomm's engine idle in the background during the raw peer's")
    return (f"median over iterations of the slowest rank's time; each iteration starts after "
            f"a barrier; peers alternate in blocks of {block} iterations (warm-up before each "
            f"block), {engine}")


def run_collective_benchmark(opts: CollectiveOptions, out: TextIO | None = None
                             ) -> dict[str, Any]:
    """Measure every size; rank 0 streams table rows to ``out``. Returns the result dict.

    Initialises dlcomm if needed (and shuts it down again if it did). The raw peer runs on
    a duplicate of MPI's world, so its messages never mix with dlcomm's.
    """
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    opts.validate()
    switch = EngineSwitch()
    comm = MPI.COMM_WORLD.Dup()
    rank, n = comm.Get_rank(), comm.Get_size()
    if not 0 <= opts.root < n:
        raise ValueError(f"--root must be a rank in [0, {n}), got {opts.root}")
    printing = rank == 0 and out is not None
    emulate = os.environ.get("DLCOMM_EMULATE", "")
    link = link_gbps(emulate)
    result: dict[str, Any] = {
        "benchmark": opts.collective, "ranks": n, "dtype": np.dtype(opts.dtype).name,
        "op": opts.op, "root": opts.root, "warmup": opts.warmup, "iters": opts.iters,
        "timing": timing_text(opts.block, switch.raw_peer_engine),
        "raw_peer_engine": switch.raw_peer_engine, "block": opts.block,
        "command": opts.argv, "emulate": emulate, "link_GBps": link,
        "allreduce_algorithm": os.environ.get("DLCOMM_ALLREDUCE_ALGORITHM", "").strip()
        or "auto",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": describe_machine() if rank == 0 else None,
        "rows": [],
    }
    try:
        if printing:
            print(format_header(result), file=out, flush=True)
        for nbytes in opts.sizes:
            row = measure_size(opts, nbytes, comm, switch, link)
            result["rows"].append(row)
            if printing:
                print(format_row(row), file=out, flush=True)
    finally:
        comm.Free()
        switch.stop()
    result["load_average_end"] = load_average()
    result["all_ok"] = all(
        row[p].get("check", "OK") == "OK" for row in result["rows"] for p in (DLCOMM, RAW)
    )
    if printing:
        print(f"# {'all results correct' if result['all_ok'] else 'SOME RESULTS WRONG (FAIL)'};"
              f" load average at end {result['load_average_end']}", file=out, flush=True)
    return result


def main_collective(opts: CollectiveOptions, json_path: str | None = None,
                    plot_path: str | None = None) -> int:
    """Run the benchmark on this rank; rank 0 writes JSON and the plot. Exit code 1 on FAIL."""
    result = run_collective_benchmark(opts, sys.stdout)
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        if json_path:
            write_json(result, json_path)
        if plot_path:
            plot_busbw([result], plot_path)
    return 0 if result["all_ok"] else 1
