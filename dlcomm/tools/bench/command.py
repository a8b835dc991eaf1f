"""``dlcomm bench ...``: collective bandwidth, latency, fusion, and the report behind
docs/benchmarks.md.

The collective and fusion benchmarks run on every rank of a job
(``dlcommrun -np 4 dlcomm bench allreduce -b 4K -e 64M -f 4``; rank 0 prints);
``dlcomm bench report`` starts such jobs itself and writes the Markdown report.
Benchmarks written elsewhere plug in through ``EXTERNAL_ACTIONS`` (module with
``register(actions)``), with a placeholder until their module exists, as in ``dlcomm.cli.main``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from dlcomm.tools.bench.arguments import count_arg, size_arg, size_list_arg
from dlcomm.tools.bench.collective import CollectiveOptions, main_collective
from dlcomm.tools.bench.fusion import FusionOptions, main_fusion
from dlcomm.tools.bench.peers import DTYPES, OPS
from dlcomm.tools.bench.report import main_report
from dlcomm.tools.bench.units import COLLECTIVES, parse_size, size_range

NAME = "bench"
EXIT_NOT_AVAILABLE = 2

# action name -> module defining register(actions); imported on every `dlcomm` call, so
# such modules keep their heavy imports inside their handlers.
EXTERNAL_ACTIONS: dict[str, str] = {
    "train": "dlcomm.tools.bench.train",
    "corun": "dlcomm.tools.bench.corun",
    "exchange": "dlcomm.tools.bench.exchange",
    "roundtrip": "dlcomm.tools.bench.roundtrip",
    "fl": "dlcomm.tools.bench.fl",
    "fl-schedule": "dlcomm.tools.bench.fl_schedule",
    "kfac": "dlcomm.tools.bench.kfac",
    "cache": "dlcomm.tools.bench.data_cache",
    "update": "dlcomm.tools.bench.update",
}


def _add_block(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block", type=count_arg(1), default=5, metavar="N",
                   help="peers alternate in blocks of N timed iterations, each after the "
                   "warm-up; dlcomm's engine is stopped for the raw peer's blocks (default 5)")


def _add_collective(actions: argparse._SubParsersAction, collective: str) -> None:
    p = actions.add_parser(
        collective, help=f"{collective} bandwidth per size, dlcomm against raw mpi4py",
        description=f"Time dlcomm's {collective} and the raw mpi4py call on the same buffers "
        "for each size (run under dlcommrun; rank 0 prints). algbw = bytes / time; busbw as "
        "nccl-tests defines it.")
    p.add_argument("-b", "--minbytes", type=size_arg, default=parse_size("4K"), metavar="SIZE",
                   help="smallest size, e.g. 8, 1K, 4M (default 4K)")
    p.add_argument("-e", "--maxbytes", type=size_arg, default=parse_size("64M"), metavar="SIZE",
                   help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=count_arg(1), default=4, metavar="F",
                   help="multiply the size by F each step (default 4)")
    p.add_argument("--sizes", type=size_list_arg, default=None, metavar="LIST",
                   help="explicit sizes instead of -b/-e/-f, e.g. 4K,64M")
    p.add_argument("-w", "--warmup", type=count_arg(0), default=3, metavar="N",
                   help="untimed warm-up iterations per size (default 3)")
    p.add_argument("-n", "--iters", type=count_arg(1), default=20, metavar="N",
                   help="timed iterations per size; the median is reported (default 20)")
    p.add_argument("-d", "--dtype", default="float32", choices=DTYPES,
                   help="element type (default float32)")
    p.add_argument("-o", "--op", default="sum", choices=OPS,
                   help="reduction (allreduce and reducescatter only; default sum)")
    p.add_argument("-r", "--root", type=count_arg(0), default=0,
                   help="broadcast's root rank (default 0)")
    _add_block(p)
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (rank 0)")
    p.add_argument("--plot", metavar="PNG", help="draw busbw against size (rank 0)")
    p.set_defaults(func=run_collective, collective=collective)


def _add_latency(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser(
        "latency", help="small synchronous all-reduces, dlcomm against raw mpi4py",
        description="Time a synchronous dlcomm.allreduce of small buffers (default 4 KiB: the "
        "engine's per-request cost) against the raw mpi4py Allreduce, in alternating blocks "
        "(run under dlcommrun; rank 0 prints). The same table as `dlcomm bench allreduce`.")
    p.add_argument("--sizes", type=size_list_arg, default=[parse_size("4K")], metavar="LIST",
                   help="sizes, e.g. 4K or 8,4K,64K (default 4K)")
    p.add_argument("-w", "--warmup", type=count_arg(0), default=20, metavar="N",
                   help="untimed iterations before each block (default 20)")
    p.add_argument("-n", "--iters", type=count_arg(1), default=200, metavar="N",
                   help="timed iterations per size; the median is reported (default 200)")
    p.add_argument("-d", "--dtype", default="float32", choices=DTYPES,
                   help="element type (default float32)")
    p.add_argument("--block", type=count_arg(1), default=50, metavar="N",
                   help="peers alternate in blocks of N timed iterations (default 50)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (rank 0)")
    p.set_defaults(func=run_collective, collective="allreduce", op="sum", root=0)


def _add_fusion(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser(
        "fusion", help="N small async all-reduces against one concatenated raw call",
        description="N tensors of S bytes all-reduced with allreduce_async + synchronize, "
        "with one allreduce_async_batch, with grouped_allreduce, with one raw Allreduce of the "
        "same bytes concatenated, and with N raw Allreduce calls (run under dlcommrun; rank 0 "
        "prints).")
    p.add_argument("--tensors", type=count_arg(1), default=200, help="N (default 200)")
    p.add_argument("--tensor-bytes", type=size_arg, default=40_000, metavar="SIZE",
                   help="bytes per tensor (default 40000)")
    p.add_argument("-w", "--warmup", type=count_arg(0), default=3, metavar="N",
                   help="untimed warm-up iterations (default 3)")
    p.add_argument("-n", "--iters", type=count_arg(1), default=20, metavar="N",
                   help="timed iterations; the median is reported (default 20)")
    p.add_argument("-d", "--dtype", default="float32", choices=("float32", "float64"))
    _add_block(p)
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (rank 0)")
    p.set_defaults(func=run_fusion)


def _add_report(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser(
        "report", help="run the benchmark suite and write docs/benchmarks.md",
        description="Start the benchmark jobs (shared memory, and the emulated cluster when "
        "root and ip are available) and write a Markdown report with each command, date and "
        "machine description. What `make bench` runs.")
    p.add_argument("--output", default="docs/benchmarks.md", help="Markdown file to write")
    p.add_argument("--np", type=count_arg(2), default=4, help="ranks per job (default 4)")
    p.add_argument("--only", default=None, metavar="LIST",
                   help="comma-separated section names to run (default all)")
    p.add_argument("--quick", action="store_true",
                   help="few sizes and iterations: checks the plumbing, not the figures")
    p.add_argument("--list", action="store_true", help="list the sections and exit")
    p.set_defaults(func=run_report)


def _register_external(actions: argparse._SubParsersAction, name: str, module: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        p = actions.add_parser(name, help="(not yet available)", add_help=False)

        def not_available(_args: argparse.Namespace) -> int:
            print(f"dlcomm bench {name}: not yet available in this version of dlcomm",
                  file=sys.stderr)
            return EXIT_NOT_AVAILABLE

        p.set_defaults(func=not_available, accepts_any_arguments=True)
        return
    mod.register(actions)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench`` and its actions."""
    parser = subparsers.add_parser(
        NAME, help="benchmarks: collective bandwidth, fusion, the docs/benchmarks.md report",
        description="Benchmarks. Collective and fusion benchmarks run on every rank: "
        "dlcommrun -np 4 dlcomm bench allreduce -b 4K -e 64M -f 4")
    actions = parser.add_subparsers(dest="bench_action", metavar="ACTION", required=True)
    for collective in COLLECTIVES:
        _add_collective(actions, collective)
    _add_latency(actions)
    _add_fusion(actions)
    _add_report(actions)
    for name, module in EXTERNAL_ACTIONS.items():
        _register_external(actions, name, module)


def _argv() -> list[str]:
    return ["dlcomm", *sys.argv[1:]] if sys.argv and sys.argv[0] else []


def run_collective(args: argparse.Namespace) -> int:
    """Handler of the five collective actions."""
    sizes = args.sizes or size_range(args.minbytes, args.maxbytes, args.stepfactor)
    opts = CollectiveOptions(args.collective, sizes, args.warmup, args.iters, args.dtype,
                             args.op, args.root, args.block, _argv())
    opts.validate()
    return main_collective(opts, args.json, getattr(args, "plot", None))


def run_fusion(args: argparse.Namespace) -> int:
    """Handler of ``dlcomm bench fusion``."""
    opts = FusionOptions(args.tensors, args.tensor_bytes, args.warmup, args.iters,
                         args.dtype, args.block, _argv())
    opts.validate()
    return main_fusion(opts, args.json)


def run_report(args: argparse.Namespace) -> int:
    """Handler of ``dlcomm bench report``."""
    return main_report(args.output, np=args.np, only=args.only, quick=args.quick,
                       list_only=args.list)
