"""``dlcomm bench corun``: how much slower a compute block runs while other processes on the
same machine compute too.

Every emulated host of ``dlcommrun --emulate`` shares this machine's cores, so a rank's
compute speed can depend on what the *other* emulated hosts are doing (shared caches,
memory bandwidth, a hypervisor's scheduling), which a real cluster would not show. That
matters when comparing schedules that change *when* ranks compute at once (LB-BSP against
BSP in docs/heterogeneity.md). Each round times the same block in one process alone and in
``--copies`` processes started together (one thread each), alternating which goes first.

    dlcomm bench corun --kernel cnn --batch 256 --copies 2 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from typing import Any

import numpy as np

from dlcomm.tools.bench.arguments import count_arg

KERNELS = ("cnn", "matmul")
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def make_block(kernel: str, batch: int, size: int) -> Any:
    """A callable running one compute block: the demo-shaped CNN's forward and backward on
    ``batch`` 28x28 images, or a ``size`` x ``size`` float32 matrix product."""
    if kernel == "matmul":
        a = np.random.default_rng(0).random((size, size), dtype=np.float32)
        return lambda: a @ a
    import torch  # noqa: PLC0415 - optional dependency
    import torch.nn.functional as F  # noqa: PLC0415 - optional dependency

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))
    x, y = torch.rand(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def block() -> None:
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()

    return block


def _worker(kernel: str, batch: int, size: int, iters: int, barrier: Any, queue: Any) -> None:
    try:
        block = make_block(kernel, batch, size)
        for _ in range(2):  # warm-up: allocations, first-call dispatch
            block()
        barrier.wait()
        walls, cpus = [], []
        for _ in range(iters):
            w, c = time.perf_counter(), time.thread_time()
            block()
            walls.append(time.perf_counter() - w)
            cpus.append(time.thread_time() - c)
        queue.put(("ok", statistics.median(walls), statistics.median(cpus)))
    except BaseException as exc:  # reported by the parent, which must not wait forever
        barrier.abort()
        queue.put(("error", f"{type(exc).__name__}: {exc}", 0.0))


def time_together(kernel: str, copies: int, batch: int, size: int, iters: int,
                  timeout: float = 600.0) -> dict[str, float]:
    """Median wall and CPU seconds per block over ``copies`` processes started together."""
    ctx = multiprocessing.get_context("spawn")  # no forked torch or MPI state
    barrier, queue = ctx.Barrier(copies), ctx.Queue()
    saved = {k: os.environ.get(k) for k in _ONE_THREAD}
    os.environ.update({k: "1" for k in _ONE_THREAD})  # one BLAS/OpenMP thread per process
    try:
        procs = [ctx.Process(target=_worker, args=(kernel, batch, size, iters, barrier, queue))
                 for _ in range(copies)]
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        results = [queue.get(timeout=timeout) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = [r[1] for r in results if r[0] != "ok"]
    if errors:
        raise RuntimeError(f"a corun worker failed: {errors[0]}")
    return {"wall_s": statistics.median(r[1] for r in results),
            "cpu_s": statistics.median(r[2] for r in results)}


def measure(kernel: str, copies: int, batch: int, size: int, iters: int,
            rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of alone-then-together (together first in odd rounds)."""
    rows = []
    for r in range(rounds):
        order = ("alone", "together") if r % 2 == 0 else ("together", "alone")
        row: dict[str, Any] = {"round": r + 1}
        for what in order:
            row[what] = time_together(kernel, 1 if what == "alone" else copies, batch, size,
                                      iters)
        row["slowdown"] = row["together"]["wall_s"] / row["alone"]["wall_s"]
        rows.append(row)
    return rows


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g}"


def text_table(rows: list[dict[str, Any]], copies: int) -> str:
    """Rounds with wall (and CPU) ms per block alone and together, and the median."""
    lines = [f"| round | alone: ms per block (CPU) | {copies} at once: ms per block (CPU) "
             "| slowdown |", "|---|---:|---:|---:|"]
    for r in rows:
        a, t = r["alone"], r["together"]
        lines.append(f"| {r['round']} | {_ms(a['wall_s'])} ({_ms(a['cpu_s'])}) | "
                     f"{_ms(t['wall_s'])} ({_ms(t['cpu_s'])}) | {r['slowdown']:.2f}x |")
    lines.append(f"| median | {_ms(statistics.median(r['alone']['wall_s'] for r in rows))} | "
                 f"{_ms(statistics.median(r['together']['wall_s'] for r in rows))} | "
                 f"**{statistics.median(r['slowdown'] for r in rows):.2f}x** |")
    return "\n".join(lines) + "\n"


def add_block_arguments(p: argparse.ArgumentParser) -> None:
    """``--kernel``, ``--batch`` and ``--size``: the compute block of ``make_block`` (shared
    by ``corun`` and ``roundtrip``)."""

    p.add_argument("--kernel", default="cnn", choices=KERNELS,
                   help="cnn: the demo-shaped CNN's forward+backward (needs torch); matmul: "
                   "a float32 matrix product with numpy (default cnn)")
    p.add_argument("--batch", type=count_arg(1), default=256, help="cnn images per block "
                   "(default 256)")
    p.add_argument("--size", type=count_arg(1), default=512, help="matmul side (default 512)")


def require_kernel(kernel: str) -> None:
    """Exit with what to install when ``kernel`` needs a framework that is missing."""
    if kernel == "cnn":
        try:
            import torch  # noqa: F401
        except ModuleNotFoundError:
            raise SystemExit("--kernel cnn needs torch (pip install 'dlcomm[torch]'); "
                             "--kernel matmul needs only numpy") from None


def block_description(args: argparse.Namespace) -> str:
    """The block chosen by ``add_block_arguments``' options, in words."""
    if args.kernel == "cnn":
        return f"cnn, batch {args.batch}"
    return f"matmul {args.size}x{args.size}"


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench corun``."""

    p = actions.add_parser(
        "corun", help="a compute block alone against several copies at once on this machine "
        "(a driver: not under dlcommrun)",
        description="Time one compute block in a single process and in --copies processes "
        "started together (one thread each), in alternating rounds: how much co-located "
        "ranks slow each other's computation on this machine.")
    add_block_arguments(p)
    p.add_argument("--copies", type=count_arg(1), default=2, help="processes computing at once "
                   "(default 2)")
    p.add_argument("--iters", type=count_arg(1), default=10, help="timed blocks per process; "
                   "the median is kept (default 10)")
    p.add_argument("--rounds", type=count_arg(1), default=3, help="alternating rounds "
                   "(default 3)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the rounds as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    require_kernel(args.kernel)
    print(f"dlcomm bench corun: {block_description(args)}, {args.copies} processes at once, "
          f"{args.iters} blocks each, {args.rounds} rounds, {os.cpu_count()} cores", flush=True)
    rows = measure(args.kernel, args.copies, args.batch, args.size, args.iters, args.rounds)
    print(text_table(rows, args.copies), end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernel": args.kernel, "batch": args.batch, "size": args.size,
                       "copies": args.copies, "iters": args.iters, "cores": os.cpu_count(),
                       "rounds": rows}, f, indent=1)
    return 0
