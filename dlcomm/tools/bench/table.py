"""Printing benchmark results: the text table rank 0 streams, Markdown for the report, JSON.

A collective result is the dict ``run_collective_benchmark`` returns: a header (collective,
ranks, dtype, op, counts) and ``rows``, one per size, each with a figures dict per peer
(``dlcomm``, ``mpi4py``), ``ratio`` (dlcomm's median time over the raw call's) and
``ratio_paired`` (the median over iterations of dlcomm's time over the raw call's time in the
same iteration).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dlcomm.tools.bench.units import format_size

PEERS = ("dlcomm", "mpi4py")
_PEER_TITLES = {"dlcomm": "dlcomm", "mpi4py": "mpi4py (raw)"}
_PEER_COLS = "{:>11} {:>12} {:>12} {:>6}"


def format_us(seconds: float | None) -> str:
    """Seconds as microseconds with sensible precision (``12.3``, ``4567``), or ``n/a``."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def format_ratio(ratio: float | None) -> str:
    """A time ratio such as ``1.03x``, or ``n/a``."""
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def _check_result(result: Any) -> None:
    if not isinstance(result, dict) or "rows" not in result or "benchmark" not in result:
        raise TypeError("expected a benchmark result dict (with 'benchmark' and 'rows')")


def format_header(result: dict[str, Any]) -> str:
    """The lines printed above the rows: what was measured, how, and the column titles."""
    _check_result(result)
    op = f", op {result['op']}" if result["benchmark"] in ("allreduce", "reducescatter") else ""
    emulate = f", emulated cluster {result['emulate']}" if result.get("emulate") else ""
    width = len(_PEER_COLS.format("", "", "", ""))
    peers = "  ".join(f"{_PEER_TITLES[p]:-^{width}}" for p in PEERS)
    cols = _PEER_COLS.format("time(us)", "algbw(GB/s)", "busbw(GB/s)", "check")
    link = result.get("link_GBps")
    lines = [
        f"# dlcomm bench {result['benchmark']}: {result['ranks']} ranks, {result['dtype']}{op}"
        f"{emulate}; {result['warmup']} warm-up + {result['iters']} timed iterations",
        f"# time: {result['timing']}",
    ]
    if link:
        lines.append(f"# link: {link:.3f} GB/s per host each way; 'of link' = busbw / link "
                     "(dlcomm, raw)")
    lines += [f"# {'':>9} {'':>11}  {peers}",
              f"# {'size':>9} {'count':>11}  {cols}  {cols}  {'dlcomm/raw':>10} {'paired':>7}"
              + (f" {'of link':>13}" if link else "")]
    return "\n".join(lines)


def _peer_cells(figures: dict[str, Any]) -> str:
    if "unavailable" in figures:
        return _PEER_COLS.format("n/a", "n/a", "n/a", "n/a")
    return _PEER_COLS.format(format_us(figures["median_s"]), f"{figures['algbw_GBps']:.3f}",
                             f"{figures['busbw_GBps']:.3f}", figures["check"])


def format_row(row: dict[str, Any]) -> str:
    """One size as a text row aligned under ``format_header``."""
    if not isinstance(row, dict) or "bytes" not in row:
        raise TypeError("expected a result row dict (with 'bytes')")
    cells = "  ".join(_peer_cells(row[p]) for p in PEERS)
    text = (f"  {format_size(row['bytes']):>9} {row['count']:>11}  {cells}  "
            f"{format_ratio(row.get('ratio')):>10} {format_ratio(row.get('ratio_paired')):>7}")
    if "busbw_of_link" in row["dlcomm"]:
        text += f" {_of_link(row['dlcomm']):>6} {_of_link(row['mpi4py']):>6}"
    return text


def _of_link(figures: dict[str, Any]) -> str:
    """busbw as a fraction of the emulated link, or n/a."""
    return f"{figures['busbw_of_link']:.2f}" if "busbw_of_link" in figures else "n/a"


def format_table(result: dict[str, Any]) -> str:
    """The whole text table (header and rows)."""
    _check_result(result)
    return "\n".join([format_header(result), *(format_row(r) for r in result["rows"])]) + "\n"


def markdown_table(result: dict[str, Any]) -> str:
    """The result as a Markdown table for docs/benchmarks.md."""
    _check_result(result)
    link = bool(result.get("link_GBps"))
    lines = [
        "| size | dlcomm time (us) | dlcomm busbw (GB/s) | mpi4py time (us) "
        "| mpi4py busbw (GB/s) | dlcomm / mpi4py time | paired ratio | check |"
        + (" busbw / link (dlcomm, mpi4py) |" if link else ""),
        "|---:|---:|---:|---:|---:|---:|---:|:---:|" + ("---:|" if link else ""),
    ]
    for row in result["rows"]:
        dl, raw = row["dlcomm"], row["mpi4py"]
        raw_time = "n/a" if "unavailable" in raw else format_us(raw["median_s"])
        raw_bw = "n/a" if "unavailable" in raw else f"{raw['busbw_GBps']:.3f}"
        check = dl["check"] if "unavailable" in raw else f"{dl['check']} / {raw['check']}"
        lines.append(f"| {format_size(row['bytes'])} | {format_us(dl['median_s'])} "
                     f"| {dl['busbw_GBps']:.3f} | {raw_time} | {raw_bw} "
                     f"| {format_ratio(row.get('ratio'))} "
                     f"| {format_ratio(row.get('ratio_paired'))} | {check} |"
                     + (f" {_of_link(dl)}, {_of_link(raw)} |" if link else ""))
    return "\n".join(lines) + "\n"


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    """Write ``result`` as indented JSON (creating the folder); return the path."""
    if not isinstance(result, dict):
        raise TypeError(f"result must be a dict, got {type(result).__name__}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    return out


def read_json(path: str | Path) -> dict[str, Any]:
    """Read a result written by ``write_json``."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a benchmark result (a JSON object)")
    return data
