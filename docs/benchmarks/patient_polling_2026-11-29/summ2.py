"""Per state and config: each round's ms per iteration and CPU (main+other), medians, and
the per-round top-k / dense ratio. Usage: summ2.py OUTDIR"""
import glob
import json
import os
import statistics
import sys

rows = {}
for f in sorted(glob.glob(f"{sys.argv[1]}/*_*.json")):
    side = os.path.basename(f).rsplit("_", 1)[0]
    for r in json.load(open(f)):
        cpu = r["cpu_ms_per_iteration"][0]
        rows.setdefault((side, r["compression"]), []).append(
            (r["ms_per_iteration"], cpu["main_thread"] + cpu["other_threads"]))
for (side, comp), v in sorted(rows.items()):
    print(f"{side} {comp}: " + ", ".join(f"{a:.0f} ms ({c:.0f} cpu)" for a, c in v)
          + f" | median {statistics.median(a for a, _ in v):.0f} ms")
for side in sorted({s for s, _ in rows}):
    dense = rows.get((side, "none"))
    topk = [v for (s, c), v in rows.items() if s == side and c != "none"]
    if dense and topk:
        ratios = [d[0] / t[0] for d, t in zip(dense, topk[0])]
        print(f"{side} dense/top-k per round: " + ", ".join(f"{x:.2f}x" for x in ratios)
              + f" | median {statistics.median(ratios):.2f}x")
