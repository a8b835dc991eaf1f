"""Per tensor and phase, the median duration over every rank's timeline file (DLCOMM_TIMELINE
with '{rank}'), after the first SKIP events of each (tensor, phase) in each file.

Usage: python phase_medians.py "DIR/tl_*.json" SKIP
"""
from __future__ import annotations

import glob
import json
import statistics
import sys

PHASES = ("compress", "decompress", "forward", "backward", "step")


def main(pattern: str, skip: int) -> None:
    durations: dict[tuple[str, str], list[float]] = {}
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            events = json.load(f)
        events = events["traceEvents"] if isinstance(events, dict) else events
        rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        mine: dict[tuple[str, str], list[float]] = {}
        for e in sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"]):
            mine.setdefault((str(rows.get(e["tid"], e["tid"])), e["name"]), []).append(
                e["dur"] / 1e3)
        for key, values in mine.items():
            durations.setdefault(key, []).extend(values[skip:])
    for (row, phase), values in sorted(durations.items()):
        if phase not in PHASES or not values:
            continue
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        print(f"{row:24s} {phase:11s} n={len(values):3d} median {statistics.median(values):7.2f} ms"
              f"  q1-q3 {q[0]:.2f}-{q[2]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
