#!/bin/bash
# Issue 25: time to accuracy of topk:hierarchical=auto beside flat top-k and htopk at 10%
# density, 2 emulated hosts x 2 slots at 1 Gb/s (the command of
# docs/benchmarks/htopk_density_2026-11-29/tta.sh with the auto spec added). The cost cache
# starts empty, so auto's job includes its measurement.
cd "$(git rev-parse --show-toplevel)"
D=docs/benchmarks/htopk_choice_2026-11-29
rm -rf /tmp/dlcomm-tta-costs
uptime > $D/tta_uptime_start.txt
DLCOMM_COMPRESSION_COST_CACHE=/tmp/dlcomm-tta-costs DLCOMM_HIERARCHICAL_RANKS_PER_HOST=2 \
python -m dlcomm.tools.bench.convergence --np 4 --epochs 5 \
  --dataset mnist --emulate 2x1gbit --slots-per-host 2 --model mlp --target 0.85 \
  --specs "topk:ratio=0.1,approx=1;htopk:ratio=0.1,approx=1;topk:ratio=0.1,approx=1,hierarchical=auto" \
  --json $D/tta_2x2.json > $D/tta_2x2.log 2>&1
uptime > $D/tta_uptime_end.txt
