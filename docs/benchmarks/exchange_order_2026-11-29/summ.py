"""Per state: each round's median iteration (ms), CPU per iteration (main + other, rank
means), and the medians over rounds. Usage: summ.py OUTDIR"""
import glob
import json
import os
import statistics
import sys

rows = {}
for f in sorted(glob.glob(f"{sys.argv[1]}/*_*.json")):
    side = os.path.basename(f).rsplit("_", 1)[0]
    (r,) = json.load(open(f))
    cpu = r["cpu_ms_per_iteration"][0]
    rows.setdefault(side, []).append(
        (r["ms_per_iteration"], cpu["main_thread"], cpu["other_threads"]))
for side, v in sorted(rows.items()):
    print(f"{side}: " + ", ".join(f"{a:.0f} ms ({b:.0f}+{c:.0f} cpu)" for a, b, c in v)
          + f" | median {statistics.median(a for a, _, _ in v):.0f} ms, cpu "
          f"{statistics.median(b + c for _, b, c in v):.0f} ms/iter")
