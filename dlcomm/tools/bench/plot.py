"""``--plot``: bus bandwidth against message size, one line per peer and per result."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlcomm.tools.bench.table import PEERS
from dlcomm.tools.bench.units import format_size


def _label(result: dict[str, Any], peer: str, several: bool) -> str:
    where = result.get("emulate") or "shared memory"
    return f"{peer} ({where})" if several else peer


def plot_busbw(results: Sequence[dict[str, Any]], path: str | Path,
               title: str | None = None) -> Path:
    """Draw busbw (GB/s) against size (log scale) for each peer of each result; save ``path``.

    Several results (say shared memory and an emulated cluster) share one figure, each
    labelled with where it ran.
    """
    if isinstance(results, dict) or not results:
        raise TypeError("results must be a non-empty list of benchmark result dicts")
    import matplotlib  # noqa: PLC0415 - optional dependency (the bench extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - optional dependency (the bench extra)

    several = len(results) > 1
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"dlcomm": "-o", "mpi4py": "--s"}
    for result in results:
        for peer in PEERS:
            rows = [r for r in result["rows"] if "busbw_GBps" in r[peer]]
            if not rows:
                continue
            ax.plot([r["bytes"] for r in rows], [r[peer]["busbw_GBps"] for r in rows],
                    styles[peer], label=_label(result, peer, several), markersize=4)
    sizes = sorted({r["bytes"] for res in results for r in res["rows"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([format_size(s) for s in sizes], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    first = results[0]
    ax.set_title(title or f"{first['benchmark']}: {first['ranks']} ranks, {first['dtype']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
