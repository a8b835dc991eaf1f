"""Status and speed of dlcomm's C++ kernels: ``python -m dlcomm.tools.bench.kernels
[status|bench]`` prints whether the kernels are in use and numpy vs native (vs torch) GB/s."""
from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

import numpy as np

from dlcomm.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from dlcomm.kernels import (
    available,
    bf16_add_,
    bf16_bits_to_float32,
    count_above,
    ef_select,
    float16_add_,
    float16_to_float32,
    float32_to_bf16_bits,
    float32_to_float16,
    library_path,
    load_error,
    num_threads,
    pack_signs,
    simd_available,
    unpack_signs,
)


def _bench_cases(n: int, torch: Any) -> list[tuple[str, int, Any, Any, Any]]:
    """(kernel, input bytes, numpy fn, native fn, torch fn or None) on n elements."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    r = rng.standard_normal(n).astype(np.float32)
    h, acc16 = x.astype(np.float16), r.astype(np.float16)
    bits, acc_bits = float_to_bf16_bits(x), float_to_bf16_bits(r)
    packed = np.packbits(x >= 0)
    scale = np.array([0.5], np.float32)
    thr = np.float32(3.3)  # about 0.1% of |x + r| (std sqrt 2) lies above it
    t = tb = None
    if torch is not None:
        t, tr = torch.from_numpy(x), torch.from_numpy(r)
        th, tacc = t.half(), tr.half()
        tb = t.bfloat16()

    def numpy_select() -> object:
        acc = x + r
        idx = np.flatnonzero(np.abs(acc) >= thr)
        est = np.zeros_like(acc)
        est[idx] = acc[idx]
        return acc[idx], idx.astype(np.int32), acc - est

    k = max(1, n // 1000)
    return [
        ("float32 -> float16", x.nbytes, lambda: x.astype(np.float16),
         lambda: float32_to_float16(x), t is not None and (lambda: t.half())),
        ("float16 -> float32", h.nbytes, lambda: h.astype(np.float32),
         lambda: float16_to_float32(h), t is not None and (lambda: th.float())),
        ("float16 sum b += a", 2 * h.nbytes, lambda: np.add(h, acc16, out=acc16),
         lambda: float16_add_(h, acc16), t is not None and (lambda: tacc.add_(th))),
        ("float32 -> bfloat16", x.nbytes, lambda: float_to_bf16_bits(x),
         lambda: float32_to_bf16_bits(x), t is not None and (lambda: t.bfloat16())),
        ("bfloat16 -> float32", bits.nbytes, lambda: bf16_bits_to_float(bits),
         lambda: bf16_bits_to_float32(bits), tb is not None and (lambda: tb.float())),
        ("bfloat16 sum b += a", 2 * bits.nbytes,
         lambda: float_to_bf16_bits(bf16_bits_to_float(bits) + bf16_bits_to_float(acc_bits)),
         lambda: bf16_add_(bits, acc_bits.copy()), None),
        ("sign pack (x >= 0)", x.nbytes, lambda: np.packbits(x >= 0), lambda: pack_signs(x),
         None),
        ("sign unpack * scale", 4 * n,
         lambda: (np.unpackbits(packed)[:n].astype(np.float32) * 2 - 1) * scale,
         lambda: unpack_signs(packed, n, np.float32, scale), None),
        ("count abs(g + r) >= t", 2 * x.nbytes, lambda: np.count_nonzero(np.abs(x + r) >= thr),
         lambda: count_above(x, thr, r), None),
        ("EF select (g + r, abs >= t, residual)", 2 * x.nbytes, numpy_select,
         lambda: ef_select(x, thr, r),
         t is not None and (lambda: torch.topk((t + tr).abs(), k, sorted=False))),
    ]


def bench(sizes: tuple[int, ...] = (1 << 20, 1 << 24), repeats: int = 5) -> list[dict]:
    """Rows {kernel, elements, numpy/native/torch GB/s}: medians of interleaved runs."""
    try:
        import torch  # noqa: PLC0415 - optional peer, only in the benchmark
    except ImportError:
        torch = None
    rows = []
    for n in sizes:
        for name, nbytes, *fns in _bench_cases(n, torch):
            times: list[list[float]] = [[] for _ in fns]
            for _ in range(repeats + 1):  # the first round warms up
                for i, fn in enumerate(fns):
                    if fn:
                        start = time.perf_counter()
                        fn()
                        times[i].append(time.perf_counter() - start)
            gbps = [nbytes / float(np.median(ts[1:])) / 1e9 if ts else None for ts in times]
            rows.append({"kernel": name, "elements": n, "numpy": gbps[0], "native": gbps[1],
                         "torch": gbps[2]})
    return rows


def format_bench(rows: list[dict]) -> str:
    """Markdown table of ``bench`` rows (GB/s of input; speed-up = native / numpy)."""
    lines = ["| kernel | elements | numpy GB/s | native GB/s | torch GB/s | native/numpy |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        torch_cell = f"{r['torch']:.2f}" if r["torch"] else "-"
        lines.append(f"| {r['kernel']} | {r['elements'] / 2**20:g}M | {r['numpy']:.2f} | "
                     f"{r['native']:.2f} | {torch_cell} | {r['native'] / r['numpy']:.1f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m dlcomm.tools.bench.kernels [status|bench] [--sizes N ...] [--repeats R]``."""
    parser = argparse.ArgumentParser(prog="python -m dlcomm.tools.bench.kernels",
                                     description="dlcomm native kernels: status and benchmark")
    parser.add_argument("action", choices=["status", "bench"], nargs="?", default="status")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 1 << 24])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.sizes) or args.repeats < 1:
        parser.error("sizes and repeats must be >= 1")
    print(f"native library: {'in use' if available() else 'NOT in use: ' + str(load_error())}"
          f" ({library_path()}), threads {num_threads()}, AVX2/F16C {simd_available()}")
    if args.action == "bench":
        print(f"# {platform.node()}, {platform.machine()}, {os.cpu_count()} CPUs, numpy "
              f"{np.__version__}, median of {args.repeats}")
        print(format_bench(bench(tuple(args.sizes), args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
