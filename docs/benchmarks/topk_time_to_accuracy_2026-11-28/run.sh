#!/bin/bash
# Issue 25 item 4: time to accuracy of dense, flat, global and hierarchical top-k on
# 2 emulated hosts x 2 slots at 1 Gb/s (MNIST subset, the 23 MB mlp, 5 epochs).
cd "$(git rev-parse --show-toplevel)"
D=docs/benchmarks/topk_time_to_accuracy_2026-11-28
uptime > $D/uptime_start.txt
DLCOMM_HIERARCHICAL_RANKS_PER_HOST=2 python -m dlcomm.tools.bench.convergence --np 4 --epochs 5 \
  --dataset mnist --emulate 2x1gbit --slots-per-host 2 --model mlp --target 0.85 \
  --specs "none;topk:ratio=0.01,approx=1;htopk:ratio=0.01,approx=1;gtopk:ratio=0.01" \
  --json $D/2x2.json > $D/2x2.log 2>&1
uptime > $D/uptime_end.txt
