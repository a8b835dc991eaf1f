"""``dlcomm timeline summary|plot``: read the Chrome trace a run wrote with DLCOMM_TIMELINE."""
from __future__ import annotations

import argparse

from dlcomm.tools.timeline.plot import plot_timeline
from dlcomm.tools.timeline.summary import format_summary, load_trace, summarize

NAME = "timeline"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dlcomm timeline`` and its ``summary`` and ``plot`` actions."""
    parser = subparsers.add_parser(
        NAME,
        help="summarise or plot a timeline written with DLCOMM_TIMELINE",
        description="Read the Chrome trace JSON that DLCOMM_TIMELINE writes (one file per "
        "rank with '{rank}' in the path). Open it in https://ui.perfetto.dev for the full view.",
    )
    actions = parser.add_subparsers(dest="timeline_action", metavar="ACTION", required=True)

    summary = actions.add_parser("summary", help="time per phase and the top tensors")
    summary.add_argument("paths", nargs="+", metavar="PATH", help="timeline file(s)")
    summary.add_argument("--top", type=int, default=10,
                         help="tensors to list by communicate time (default 10)")
    summary.set_defaults(func=run_summary)

    plot = actions.add_parser("plot", help="Gantt chart of phases per tensor")
    plot.add_argument("paths", nargs="+", metavar="PATH", help="timeline file(s)")
    plot.add_argument("-o", "--output", required=True, help="image to write, e.g. tl.png")
    plot.add_argument("--max-rows", type=int, default=80,
                      help="most tensor rows to draw (default 80)")
    plot.set_defaults(func=run_plot)


def run_summary(args: argparse.Namespace) -> int:
    """Print the phase and tensor tables."""
    print(format_summary(summarize(load_trace(args.paths)), top=args.top), end="")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    """Write the Gantt chart and say where."""
    out = plot_timeline(load_trace(args.paths), args.output, max_rows=args.max_rows)
    print(f"wrote {out}")
    return 0
