#!/bin/bash
# Issue 25 item 1: top-k with the hierarchy chosen by measured cost (hierarchical=auto)
# beside flat top-k and htopk at 1% and 10% density, on 2 emulated hosts x 2 slots at 1 Gb/s.
# The choice is measured at the first step (a warm-up step); rank 0 logs it at INFO.
cd "$(git rev-parse --show-toplevel)"
D=docs/benchmarks/htopk_choice_2026-11-29
rm -rf ~/.cache/dlcomm/allreduce
uptime > $D/uptime_start.txt
DLCOMM_LOG_LEVEL=info dlcomm bench train --np 4 --emulate 2x1gbit --slots-per-host 2 \
  --model mlp --peers none \
  --configs "topk:ratio=0.1,approx=1;htopk:ratio=0.1,approx=1;topk:ratio=0.1,approx=1,hierarchical=auto;topk:ratio=0.01,approx=1;htopk:ratio=0.01,approx=1;topk:ratio=0.01,approx=1,hierarchical=auto" \
  --iters 12 --batches-per-iter 1 --warmup 5 --repeats 2 --no-scaling \
  --json $D/choice_2x2.json > $D/choice_2x2.log 2>&1
uptime > $D/uptime_end.txt
