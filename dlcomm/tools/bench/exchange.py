"""``dlcomm bench exchange``: DLCP's bounded-loss exchange against lossless all-reduces
(MPI's own and dlcomm's algorithms) on the same gradient, optionally with what one emulated
host's link carried meanwhile.

Run under ``dlcommrun`` (every rank takes part; rank 0 prints). Each peer runs ``--blocks``
blocks of ``--iters`` timed operations, peers alternating block by block; every operation
starts after a barrier and its time is the *slowest* rank's (a rank that has its own result
early still waits for the others in the next step). With ``--monitor-host H`` rank 0 reads
host H's two shapers (``link_monitor``) during the timed blocks: megabytes per step each way,
the rate the link actually ran at, and its peak queue.

    dlcommrun --emulate 4x1gbit --heterogeneity 'congest=3:50mbit:100:0.01,seed=1' \\
        dlcomm bench exchange --algorithms mpi,ring --tolerances 1e-9,0.1 --monitor-host 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

from dlcomm.heterogeneity.dlcp import BoundedLossExchange
from dlcomm.tools.bench.arguments import count_arg
from dlcomm.tools.emulation.link_monitor import LinkMonitor, summarize_window

# The demo CNN's parameter sizes (examples/torch_mnist.py, 28x28 inputs): 0.83 MB of float32.
DEMO_CNN_SIZES = (144, 16, 4608, 32, 200704, 128, 1280, 10)
PROTECT_BELOW = 1024  # the torch adapter never drops vectors and tensors this small


def _comma_list(text: str, convert: Any, what: str) -> list[Any]:
    """The non-empty comma-separated items of ``text``, each through ``convert``; an
    argparse error naming ``what`` when one does not convert."""
    try:
        return [convert(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") \
            from None


def _tolerance_list(text: str) -> list[float]:
    values = _comma_list(text, float, "numbers")
    if any(not 0.0 < v < 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"tolerances must be in (0, 1), got {text!r}")
    return values


def _size_list(text: str) -> list[int]:
    values = _comma_list(text, int, "counts")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"sizes must be >= 1, got {text!r}")
    return values


def _algorithm_list(text: str) -> list[str]:
    # The collectives import the transport, which starts MPI: not while building the parser.
    from dlcomm.collectives.registry import ALIASES, ALLREDUCE_ALGORITHMS  # noqa: PLC0415

    names = _comma_list(text, str.lower, "names")
    unknown = [n for n in names if n not in ALLREDUCE_ALGORITHMS and n not in ALIASES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown all-reduce algorithm(s) {unknown}; choose "
                                         f"from {sorted(ALLREDUCE_ALGORITHMS)}")
    return names


def run(comm: Any, sizes: list[int], algorithms: list[str], tolerances: list[float],
        iters: int, warmup: int, blocks: int,
        monitor_host: int | None) -> list[dict[str, Any]]:
    """Every rank: time each peer's blocks; rank 0 gets the rows (others an empty list)."""
    # MPI start-up: the collectives load the transport.
    from dlcomm.collectives.registry import get_allreduce_algorithm

    flat = np.random.default_rng(comm.rank).standard_normal(sum(sizes)).astype(np.float32)
    out = np.empty_like(flat)
    protected = [s < PROTECT_BELOW for s in sizes]
    monitor, problem = None, None
    if monitor_host is not None and comm.rank == 0:
        try:
            monitor = LinkMonitor(monitor_host).start()
        except (RuntimeError, ValueError, OSError) as exc:
            problem = str(exc)
    problem = comm.bcast(problem, root=0)  # every rank fails alike, none waits for rank 0
    if problem is not None:
        raise RuntimeError(f"--monitor-host {monitor_host}: {problem}")
    exchanges: dict[float, Any] = {}
    functions = {name: get_allreduce_algorithm(name) for name in algorithms}
    peers: list[tuple[str, Any]] = [
        (f"{name} all-reduce", lambda f=functions[name]: f(comm, flat, out, "sum"))
        for name in algorithms]
    rows = []
    try:
        for p in tolerances:
            exchanges[p] = BoundedLossExchange(sizes, protected, p, comm=comm)
            peers.append((f"exchange p={p:g}", lambda ex=exchanges[p]: ex.exchange(flat)))
        for block in range(blocks):
            for name, once in peers:
                for _ in range(warmup):
                    comm.Barrier()
                    once()
                times = []
                comm.Barrier()
                start = time.time()
                for _ in range(iters):
                    comm.Barrier()
                    t = time.perf_counter()
                    once()
                    times.append(time.perf_counter() - t)
                comm.Barrier()
                end = time.time()
                slowest = np.max(np.array(comm.allgather(times)), axis=0)
                rows.append({"peer": name, "block": block + 1,
                             "median_ms": float(np.median(slowest)) * 1e3,
                             "min_ms": float(slowest.min()) * 1e3,
                             "start": start, "end": end})
    finally:
        for ex in exchanges.values():
            ex.close()
        samples = monitor.stop() if monitor is not None else []
    if comm.rank != 0:
        return []
    if monitor is not None:
        for row in rows:
            row["link"] = summarize_window(samples, row["start"], row["end"], iters)
    return rows


def text_table(rows: list[dict[str, Any]], host: int | None) -> str:
    """One line per peer and block, then the median over blocks of each peer."""
    head = "| peer | block | ms per step, median (min) |"
    rule = "|---|---:|---:|"
    if host is not None:
        head += (f" host {host} out / in: MB per step | Mbit/s | peak queue kB |")
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for r in rows:
        line = f"| {r['peer']} | {r['block']} | {r['median_ms']:.3g} ({r['min_ms']:.3g}) |"
        if "link" in r:
            k = r["link"]
            line += (f" {k['out_mb_per_step']:.2f} / {k['in_mb_per_step']:.2f} | "
                     f"{k['out_mbit_s']:.0f} / {k['in_mbit_s']:.0f} | "
                     f"{k['peak_out_backlog_kb']:.0f} / {k['peak_in_backlog_kb']:.0f} |")
        lines.append(line)
    for peer in dict.fromkeys(r["peer"] for r in rows):
        med = statistics.median(r["median_ms"] for r in rows if r["peer"] == peer)
        lines.append(f"| {peer} | median | **{med:.3g}** |" + (" | | |" if host is not None
                                                               else ""))
    return "\n".join(lines) + "\n"


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench exchange``."""

    p = actions.add_parser(
        "exchange", help="DLCP's bounded-loss exchange against MPI's all-reduce (run under "
        "dlcommrun; rank 0 prints)",
        description="Time DLCP's exchange at each tolerance against MPI's all-reduce of the "
        "same float32 gradient, peers alternating in blocks; each step's time is the "
        "slowest rank's. With --monitor-host, also what that emulated host's link carried.")
    p.add_argument("--sizes", type=_size_list, default=list(DEMO_CNN_SIZES), metavar="LIST",
                   help="tensor sizes in elements (default: the demo CNN's, 0.83 MB); "
                   f"tensors under {PROTECT_BELOW} elements are never dropped")
    p.add_argument("--algorithms", type=_algorithm_list, default=["mpi", "ring"],
                   metavar="LIST", help="lossless all-reduce peers by DLCOMM_ALLREDUCE_ALGORITHM"
                   " name; mpi = MPI's own, the engine's default (default mpi,ring)")
    p.add_argument("--tolerances", type=_tolerance_list, default=[1e-9, 0.1],
                   metavar="LIST", help="exchange peers by loss tolerance; 1e-9 = the exchange "
                   "with nothing droppable (default 1e-9,0.1)")
    p.add_argument("-n", "--iters", type=count_arg(2), default=15, metavar="N",
                   help="timed steps per block (default 15)")
    p.add_argument("-w", "--warmup", type=count_arg(0), default=3, metavar="N",
                   help="untimed steps before each block; the exchange learns its deadline "
                   "from its first steps (default 3)")
    p.add_argument("--blocks", type=count_arg(1), default=2, help="blocks per peer (default 2)")
    p.add_argument("--monitor-host", type=count_arg(0), default=None, metavar="H",
                   help="read emulated host H's shapers during the blocks (needs dlcommrun "
                   "--emulate)")
    p.add_argument("--json", default=None, metavar="PATH", help="rank 0 writes the rows here")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if not args.algorithms and not args.tolerances:
        raise SystemExit("dlcomm bench exchange: nothing to time (no --algorithms, no "
                         "--tolerances)")
    from mpi4py import MPI  # no dlcomm engine: nothing else on the links but the peers

    rows = run(MPI.COMM_WORLD, args.sizes, args.algorithms, args.tolerances, args.iters,
               args.warmup, args.blocks, args.monitor_host)
    if rows:
        print(text_table(rows, args.monitor_host), end="", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0
