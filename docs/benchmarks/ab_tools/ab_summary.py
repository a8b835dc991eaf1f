"""Summary of an ab_files.sh output folder: per state and compression, each round's ms per
iteration with the CPU per iteration (training thread + other threads, rank means), the
median over rounds, and with dense in the runs the dense / other ratio per round.

    python ab_summary.py OUTDIR
"""
import glob
import json
import os
import statistics
import sys

rows: dict = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*_*.json"))):
    side = os.path.basename(path).rsplit("_", 1)[0]
    for r in json.load(open(path)):
        cpu = r["cpu_ms_per_iteration"][0]
        rows.setdefault((side, r["compression"]), []).append(
            (r["ms_per_iteration"], cpu["main_thread"], cpu["other_threads"]))
for (side, comp), runs in sorted(rows.items()):
    print(f"{side} {comp}: " + ", ".join(f"{t:.0f} ms ({m:.0f}+{o:.0f} cpu)" for t, m, o in runs)
          + f" | median {statistics.median(t for t, _, _ in runs):.0f} ms, cpu "
          f"{statistics.median(m + o for _, m, o in runs):.0f} ms/iter")
for side in sorted({s for s, _ in rows}):
    dense = rows.get((side, "none"))
    for (s, comp), runs in sorted(rows.items()):
        if dense and s == side and comp != "none":
            ratios = [d[0] / t[0] for d, t in zip(dense, runs)]
            print(f"{side} dense / {comp} per round: "
                  + ", ".join(f"{x:.2f}x" for x in ratios)
                  + f" | median {statistics.median(ratios):.2f}x")
