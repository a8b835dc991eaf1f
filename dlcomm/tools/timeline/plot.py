"""Draws a dlcomm timeline as a Gantt chart: one row per tensor, one colour per phase.

Behind ``dlcomm timeline plot``. Uses matplotlib's Agg backend (no display needed).
"""
from __future__ import annotations

from pathlib import Path

from dlcomm.engine.timeline import PHASES
from dlcomm.tools.timeline.summary import Trace, phase_order

MAX_ROWS = 80


def plot_timeline(trace: Trace, out_path: str | Path, max_rows: int = MAX_ROWS) -> Path:
    """Save a Gantt chart of ``trace`` to ``out_path`` (format from its suffix, e.g. .png).

    Rows are tensors (``r<rank> name`` when several ranks are drawn), in order of first
    activity; beyond ``max_rows`` the rest are left out and the title says so.
    """
    if not isinstance(trace, Trace):
        raise TypeError("plot_timeline() takes a Trace (from load_trace())")
    if not isinstance(out_path, (str, Path)) or not str(out_path):
        raise TypeError(f"out_path must be a file path, got {out_path!r}")
    if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1:
        raise ValueError(f"max_rows must be a positive integer, got {max_rows!r}")
    if not trace.spans:
        raise ValueError("the timeline holds no phases to plot")
    out_path = Path(out_path)
    if not out_path.parent.is_dir():
        raise ValueError(f"cannot write {str(out_path)!r}: folder {str(out_path.parent)!r} "
                         "does not exist")
    try:
        import matplotlib  # noqa: PLC0415 - optional dependency (the bench extra)

        matplotlib.use("Agg")
        # Optional dependency (the bench extra), as above.
        import matplotlib.pyplot as plt  # noqa: PLC0415
        from matplotlib.patches import Patch  # noqa: PLC0415
    except ImportError as exc:
        raise ValueError("plotting needs matplotlib: pip install matplotlib") from exc

    several_ranks = len({s.rank for s in trace.spans}) > 1
    rows: dict[tuple[int, str], int] = {}
    for s in trace.spans:  # spans are sorted by start time
        key = (s.rank, s.tensor)
        if key not in rows and len(rows) < max_rows:
            rows[key] = len(rows)
    origin = min(s.start_us for s in trace.spans)
    phases = sorted({s.phase for s in trace.spans}, key=phase_order)
    # Engine phases keep fixed tab10 colours; other phases (the training loop's
    # forward/backward/step from timeline_range) get distinct colours of their own.
    engine_colors, other_colors = matplotlib.colormaps["tab10"], matplotlib.colormaps["Dark2"]
    others = [p for p in phases if p not in PHASES]
    colors = {p: engine_colors(PHASES.index(p)) if p in PHASES
              else other_colors(others.index(p) % other_colors.N) for p in phases}

    height = min(40.0, 1.5 + 0.3 * len(rows))
    fig, ax = plt.subplots(figsize=(12, height))
    try:
        for phase in phases:
            bars: dict[int, list[tuple[float, float]]] = {}
            for s in trace.spans:
                row = rows.get((s.rank, s.tensor))
                if s.phase == phase and row is not None:
                    bars.setdefault(row, []).append(((s.start_us - origin) / 1e3, s.dur_us / 1e3))
            for row, ranges in bars.items():
                ax.broken_barh(ranges, (row - 0.4, 0.8), facecolors=colors[phase],
                               edgecolor="white", linewidth=0.4)
        for _, _, ts in trace.instants:
            ax.axvline((ts - origin) / 1e3, color="0.6", linewidth=0.5, linestyle=":")
        labels = [f"r{rank} {name}" if several_ranks else name for rank, name in rows]
        ax.set_yticks(range(len(rows)), labels=labels, fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlabel("time (ms)")
        hidden = len({(s.rank, s.tensor) for s in trace.spans}) - len(rows)
        title = "dlcomm timeline" + (f" (first {len(rows)} rows, {hidden} more not shown)"
                                     if hidden else "")
        ax.set_title(title)
        ax.legend(handles=[Patch(color=colors[p], label=p) for p in phases],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        fig.tight_layout()
        fig.savefig(out_path, dpi=100)
    finally:
        plt.close(fig)
    return out_path
