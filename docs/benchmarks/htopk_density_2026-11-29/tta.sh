#!/bin/bash
# Issue 25: flat against hierarchical top-k at 10% density on 2 emulated hosts x 2 slots at
# 1 Gb/s, time to accuracy (MNIST subset, the 23 MB mlp, 5 epochs), as the 1% run of
# docs/benchmarks/topk_time_to_accuracy_2026-11-28/run.sh.
cd "$(git rev-parse --show-toplevel)"
D=docs/benchmarks/htopk_density_2026-11-29
uptime > $D/tta_uptime_start.txt
DLCOMM_HIERARCHICAL_RANKS_PER_HOST=2 python -m dlcomm.tools.bench.convergence --np 4 --epochs 5 \
  --dataset mnist --emulate 2x1gbit --slots-per-host 2 --model mlp --target 0.85 \
  --specs "topk:ratio=0.1,approx=1;htopk:ratio=0.1,approx=1" \
  --json $D/tta_2x2.json > $D/tta_2x2.log 2>&1
uptime > $D/tta_uptime_end.txt
