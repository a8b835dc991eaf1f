"""Compressor throughput: compress + decompress GB/s of input against a memcpy of the buffer.

Run ``python -m dlcomm.tools.bench.compression_throughput`` (``--help`` for sizes and specs). Each
compressor runs one rank's full step through ``compressed_allreduce`` on a ``SelfComm`` (so
multi-round compressors do every round's maths, error feedback included where the registry
adds it). Also times exact and approximate top-k selection against ``torch.topk`` (when torch
is installed) on one buffer. Timings are medians of ``repeats`` runs after one warm-up.
"""
from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable, Sequence

import numpy as np

from dlcomm.compression.exchange import SelfComm, compressed_allreduce
from dlcomm.compression.registry import get_compressor
from dlcomm.compression.topk_select import approx_topk_indices, exact_topk_indices

DEFAULT_SPECS = (
    "none", "fp16", "bf16", "topk:ratio=0.01", "topk:ratio=0.01,approx=1", "randomk:ratio=0.01",
    "gtopk:ratio=0.01", "efsignsgd", "signum", "qsgd:levels=16", "powersgd:rank=4",
    "acpsgd:rank=4",
)
DEFAULT_SIZES = (1 << 20, 1 << 22, 1 << 24)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, after one untimed warm-up."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_throughput(
    sizes: Sequence[int] = DEFAULT_SIZES, specs: Sequence[str] = DEFAULT_SPECS, repeats: int = 3
) -> list[dict]:
    """Rows {spec, elements, seconds, gbps, vs_memcpy}; the 'memcpy' row is the baseline.

    Buffers are float32 matrices of 1024 rows, so low-rank compressors apply.
    """
    rows = []
    for n in sizes:
        if n < 1024 or n % 1024:
            raise ValueError(f"sizes must be multiples of 1024, got {n}")
        x = np.random.default_rng(0).standard_normal((1024, n // 1024)).astype(np.float32)
        dst = np.empty_like(x)
        memcpy = median_seconds(lambda x=x, dst=dst: np.copyto(dst, x), repeats)
        rows.append(_row("memcpy", n, memcpy, memcpy, x.nbytes))
        for spec in specs:
            c = get_compressor(spec, min_compress_size=0)
            seconds = median_seconds(
                lambda c=c, x=x: compressed_allreduce(c, x, "bench", SelfComm()), repeats
            )
            rows.append(_row(spec, n, seconds, memcpy, x.nbytes))
    return rows


def measure_topk(n: int = 1 << 24, ratio: float = 0.01, repeats: int = 3) -> list[dict]:
    """Selection alone on n float32 elements: exact (argpartition), approx, torch.topk."""
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    k = max(1, int(ratio * n))
    timings = {
        "exact (argpartition)": median_seconds(lambda: exact_topk_indices(x, k), repeats),
        "approx (threshold)": median_seconds(lambda: approx_topk_indices(x, k), repeats),
    }
    try:
        import torch  # noqa: PLC0415 - optional peer
    except ImportError:
        torch = None
    if torch is not None:
        t = torch.from_numpy(x)
        timings[f"torch.topk (torch {torch.__version__}, "
                f"{torch.get_num_threads()} threads)"] = median_seconds(
            lambda: torch.topk(t.abs(), k, sorted=False), repeats)
    base = timings.get(next((key for key in timings if key.startswith("torch")), ""), None)
    return [
        {"method": m, "elements": n, "k": k, "seconds": s, "gbps": x.nbytes / s / 1e9,
         "vs_torch": (base / s) if base else float("nan")}
        for m, s in timings.items()
    ]


def _row(spec: str, n: int, seconds: float, memcpy: float, nbytes: int) -> dict:
    return {"spec": spec, "elements": n, "seconds": seconds, "gbps": nbytes / seconds / 1e9,
            "vs_memcpy": memcpy / seconds}


def format_tables(rows: list[dict], topk_rows: list[dict]) -> str:
    """Markdown tables: GB/s (and fraction of memcpy) per spec and size; top-k selection."""
    sizes = sorted({r["elements"] for r in rows})
    specs = list(dict.fromkeys(r["spec"] for r in rows))
    by = {(r["spec"], r["elements"]): r for r in rows}
    head = " | ".join(f"{n / 2**20:g}M GB/s (x memcpy)" for n in sizes)
    lines = [f"| compressor | {head} |", "|---" * (len(sizes) + 1) + "|"]
    for spec in specs:
        cells = " | ".join(
            f"{by[spec, n]['gbps']:.2f} ({by[spec, n]['vs_memcpy']:.3f})" for n in sizes
        )
        lines.append(f"| `{spec}` | {cells} |")
    if topk_rows:
        t0 = topk_rows[0]
        lines += ["", f"Top-k selection, {t0['elements'] / 2**20:g}M float32, k = {t0['k']}:", "",
                  "| method | ms | GB/s | speed-up vs torch.topk |", "|---|---|---|---|"]
        lines += [f"| {r['method']} | {r['seconds'] * 1e3:.1f} | {r['gbps']:.2f} | "
                  f"{r['vs_torch']:.2f} |" for r in topk_rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: print the tables for the requested sizes and specs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES),
                        help="element counts (multiples of 1024)")
    parser.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--topk-elements", type=int, default=1 << 24)
    args = parser.parse_args(argv)
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, numpy "
          f"{np.__version__}, median of {args.repeats}")
    rows = measure_throughput(args.sizes, args.specs, args.repeats)
    topk_rows = measure_topk(args.topk_elements, repeats=args.repeats)
    print(format_tables(rows, topk_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
