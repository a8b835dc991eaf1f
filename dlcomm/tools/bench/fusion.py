"""``dlcomm bench fusion``: many small async all-reduces against the limits fusion sits between.

N tensors of S bytes (default 200 x 40 KB, Horovod's figure in issue 2) are all-reduced five
ways, in alternating blocks of iterations (dlcomm's engine stopped during the raw peers'
blocks), each iteration timed between barriers (slowest rank, median):

- ``dlcomm async``: N ``allreduce_async`` calls, then ``synchronize`` on each (fusion's case);
- ``dlcomm batch``: one ``allreduce_async_batch`` of the N tensors (N named requests in one
  submission, what a backward hook would call), then ``synchronize`` on each;
- ``dlcomm grouped``: one ``grouped_allreduce`` of the N tensors;
- ``mpi4py concatenated``: one raw ``Allreduce`` of the N x S bytes already back to back,
  the limit fusion can reach (no packing at all);
- ``mpi4py separate``: N raw ``Allreduce`` calls, what no fusion costs.

Every peer's results are checked against a numpy reference.
"""
from __future__ import annotations

import datetime
import numbers
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

import dlcomm
from dlcomm.tools.bench.collective import timing_text
from dlcomm.tools.bench.isolation import EngineSwitch
from dlcomm.tools.bench.machine import describe_machine, load_average
from dlcomm.tools.bench.peers import rank_input, reduce_reference, results_match
from dlcomm.tools.bench.table import write_json
from dlcomm.tools.bench.timing import check_counts, summarize_times, time_in_blocks

ASYNC = "dlcomm async"
BATCH = "dlcomm batch"
GROUPED = "dlcomm grouped"
RAW_CONCAT = "mpi4py concatenated"
RAW_SEPARATE = "mpi4py separate"
PEERS = (ASYNC, BATCH, GROUPED, RAW_CONCAT, RAW_SEPARATE)
BASELINE = RAW_CONCAT


@dataclass
class FusionOptions:
    """N tensors of ``tensor_bytes`` each, ``warmup`` + ``iters`` interleaved iterations."""

    tensors: int = 200
    tensor_bytes: int = 40_000
    warmup: int = 3
    iters: int = 20
    dtype: str = "float32"
    block: int = 5  # iterations per block; peers alternate block by block
    argv: list[str] = field(default_factory=list)

    def validate(self) -> None:
        """Raise TypeError/ValueError for settings that cannot be measured."""
        check_counts(self.warmup, self.iters)
        for name, value in (("tensors", self.tensors), ("tensor_bytes", self.tensor_bytes),
                            ("block", self.block)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        dt = np.dtype(self.dtype)
        if dt.kind != "f" or dt.itemsize < 4:
            raise ValueError(f"the fusion benchmark uses float32 or float64, got {dt.name}")
        if self.tensor_bytes < dt.itemsize:
            raise ValueError(f"tensor_bytes ({self.tensor_bytes}) is smaller than one "
                             f"{dt.name} element")


def _make_peers(opts: FusionOptions, comm: Any) -> tuple[dict[str, Callable[[], list]],
                                                          list[np.ndarray], Callable[[], None]]:
    """The ways to all-reduce the tensors, the expected results, and an output reset."""
    dt = np.dtype(opts.dtype)
    count = opts.tensor_bytes // dt.itemsize
    rank, n = comm.Get_rank(), comm.Get_size()
    base = rank_input(count * opts.tensors, dt, rank)
    inputs = [base[i * count:(i + 1) * count] for i in range(opts.tensors)]
    whole = reduce_reference(count * opts.tensors, dt, "sum", n)
    expected = [whole[i * count:(i + 1) * count] for i in range(opts.tensors)]
    async_out = [np.empty(count, dt) for _ in inputs]
    batch_out = [np.empty(count, dt) for _ in inputs]
    grouped_out = [np.empty(count, dt) for _ in inputs]
    separate_out = [np.empty(count, dt) for _ in inputs]
    concat_out = np.empty(count * opts.tensors, dt)
    names = [f"bench.fusion.{i}" for i in range(opts.tensors)]

    def run_async() -> list:
        handles = [dlcomm.allreduce_async(x, name=nm, op=dlcomm.Sum, output=o)
                   for x, nm, o in zip(inputs, names, async_out)]
        return [dlcomm.synchronize(h) for h in handles]

    def run_batch() -> list:
        handles = dlcomm.allreduce_async_batch(inputs, names, op=dlcomm.Sum, outputs=batch_out)
        return [dlcomm.synchronize(h) for h in handles]

    def run_grouped() -> list:
        return dlcomm.grouped_allreduce_async(inputs, name="bench.fusion.grouped",
                                              op=dlcomm.Sum, outputs=grouped_out).wait()

    def run_concat() -> list:
        comm.Allreduce(base, concat_out)
        return [concat_out[i * count:(i + 1) * count] for i in range(opts.tensors)]

    def run_separate() -> list:
        for x, o in zip(inputs, separate_out):
            comm.Allreduce(x, o)
        return separate_out

    def reset() -> None:
        for o in (*async_out, *batch_out, *grouped_out, *separate_out, concat_out):
            o.fill(123)

    peers = {ASYNC: run_async, BATCH: run_batch, GROUPED: run_grouped, RAW_CONCAT: run_concat,
             RAW_SEPARATE: run_separate}
    return peers, expected, reset


def run_fusion_benchmark(opts: FusionOptions, out: TextIO | None = None) -> dict[str, Any]:
    """Measure every peer; rank 0 prints a table to ``out``. Returns the result dict."""
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    opts.validate()
    switch = EngineSwitch()
    comm = MPI.COMM_WORLD.Dup()
    try:
        peers, expected, reset = _make_peers(opts, comm)
        machine = describe_machine() if comm.Get_rank() == 0 else None
        enter = [switch.stop if name.startswith("mpi4py") else switch.start for name in peers]
        times = time_in_blocks(list(peers.values()), comm, opts.warmup, opts.iters,
                               opts.block, enter)
        switch.start()
        oks = []
        for run in peers.values():
            reset()
            oks.append(all(results_match(r, e) for r, e in zip(run(), expected)))
        ok = np.array(oks, dtype=np.int32)
        comm.Allreduce(MPI.IN_PLACE, ok, op=MPI.MIN)
        ranks = comm.Get_size()
    finally:
        comm.Free()
        switch.stop()
    figures = {name: {**summarize_times(times[k]), "check": "OK" if ok[k] else "FAIL"}
               for k, name in enumerate(peers)}
    base = figures[BASELINE]["median_s"]
    base_index = list(peers).index(BASELINE)
    for k, fig in enumerate(figures.values()):
        fig["vs_concatenated"] = fig["median_s"] / base
        # per-iteration ratio, median: pairs the peers' i-th iterations (neighbouring blocks)
        fig["vs_concatenated_paired"] = float(np.median(times[k] / times[base_index]))
    result = {
        "benchmark": "fusion", "ranks": ranks, "tensors": opts.tensors,
        "tensor_bytes": (opts.tensor_bytes // np.dtype(opts.dtype).itemsize)
        * np.dtype(opts.dtype).itemsize,
        "dtype": np.dtype(opts.dtype).name, "warmup": opts.warmup, "iters": opts.iters,
        "timing": timing_text(opts.block, switch.raw_peer_engine),
        "raw_peer_engine": switch.raw_peer_engine, "block": opts.block,
        "command": opts.argv, "emulate": os.environ.get("DLCOMM_EMULATE", ""),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine, "load_average_end": load_average(),
        "peers": figures, "all_ok": bool(ok.all()),
    }
    if out is not None and machine is not None:
        print(format_fusion(result), file=out, end="", flush=True)
    return result


def _paired(fig: dict[str, Any]) -> str:
    value = fig.get("vs_concatenated_paired")
    return "n/a" if value is None else f"{value:.2f}x"


def format_fusion(result: dict[str, Any]) -> str:
    """The fusion result as a text table."""
    if not isinstance(result, dict) or result.get("benchmark") != "fusion":
        raise TypeError("expected a fusion benchmark result dict")
    lines = [f"# dlcomm bench fusion: {result['ranks']} ranks, {result['tensors']} tensors x "
             f"{result['tensor_bytes']} bytes {result['dtype']}; {result['warmup']} warm-up + "
             f"{result['iters']} timed iterations",
             f"# time: {result['timing']}",
             f"# {'peer':<22} {'median(ms)':>11} {'min(ms)':>9} {'max(ms)':>9} "
             f"{'vs concatenated':>16} {'paired':>7} {'check':>6}"]
    for name, fig in result["peers"].items():
        lines.append(f"  {name:<22} {fig['median_s'] * 1e3:>11.2f} {fig['min_s'] * 1e3:>9.2f} "
                     f"{fig['max_s'] * 1e3:>9.2f} {fig['vs_concatenated']:>15.2f}x "
                     f"{_paired(fig):>7} {fig['check']:>6}")
    return "\n".join(lines) + "\n"


def markdown_fusion(result: dict[str, Any]) -> str:
    """The fusion result as a Markdown table for docs/benchmarks.md."""
    if not isinstance(result, dict) or result.get("benchmark") != "fusion":
        raise TypeError("expected a fusion benchmark result dict")
    lines = ["| peer | median (ms) | min (ms) | max (ms) | time / one concatenated call "
             "| paired ratio | check |", "|---|---:|---:|---:|---:|---:|:---:|"]
    for name, fig in result["peers"].items():
        lines.append(f"| {name} | {fig['median_s'] * 1e3:.2f} | {fig['min_s'] * 1e3:.2f} "
                     f"| {fig['max_s'] * 1e3:.2f} | {fig['vs_concatenated']:.2f}x "
                     f"| {_paired(fig)} | {fig['check']} |")
    return "\n".join(lines) + "\n"


def main_fusion(opts: FusionOptions, json_path: str | None = None) -> int:
    """Run on this rank; rank 0 writes the JSON. Exit code 1 when a result is wrong."""
    result = run_fusion_benchmark(opts, sys.stdout)
    if json_path and result["machine"] is not None:
        write_json(result, json_path)
    return 0 if result["all_ok"] else 1
