#!/bin/bash
# Issue 25 item 4: time per iteration of dense, top-k, gTop-k and htopk on the 25 MB mlp.
cd "$(git rev-parse --show-toplevel)"
out=${OUT:-topk_emulated}; mkdir -p $out
uptime > $out/uptime_start.txt
DLCOMM_HIERARCHICAL_RANKS_PER_HOST=2 dlcomm bench train --np 4 --emulate 2x1gbit --slots-per-host 2 --model mlp \
  --configs "none;topk:ratio=0.01;gtopk:ratio=0.01;htopk:ratio=0.01" --peers none --no-scaling \
  --repeats 3 --iters 3 --batches-per-iter 3 --warmup 3 --json $out/2x2.json > $out/2x2.log 2>&1
uptime > $out/uptime_mid.txt
DLCOMM_HIERARCHICAL_RANKS_PER_HOST=1 dlcomm bench train --np 4 --emulate 4x1gbit --model mlp \
  --configs "none;topk:ratio=0.01;gtopk:ratio=0.01;htopk:ratio=0.01" --peers none --no-scaling \
  --repeats 3 --iters 3 --batches-per-iter 3 --warmup 3 --json $out/4x1.json > $out/4x1.log 2>&1
uptime > $out/uptime_end.txt
# Later the same morning (07:21 UTC): approximate against exact selection, with dense.
dlcomm bench train --np 4 --emulate 4x1gbit --model mlp \
  --configs "none;topk:ratio=0.01,approx=1;topk:ratio=0.01" --peers none --no-scaling \
  --repeats 3 --iters 3 --batches-per-iter 3 --warmup 3 --json $out/4x1_approx.json > $out/4x1_approx.log 2>&1
# 2026-11-28 08:50 UTC, commit 3d97cf9: approximate flat against approximate hierarchical
# top-k on 2 hosts x 2 slots, with dense.
DLCOMM_HIERARCHICAL_RANKS_PER_HOST=2 dlcomm bench train --np 4 --emulate 2x1gbit --slots-per-host 2 --model mlp \
  --configs "none;topk:ratio=0.01,approx=1;htopk:ratio=0.01,approx=1" --peers none --no-scaling \
  --repeats 3 --iters 3 --batches-per-iter 3 --warmup 3 --json $out/2x2_approx.json > $out/2x2_approx.log 2>&1
# 2026-11-28 15:49-15:56 UTC, commit 13e39d9 (the mesh's 128 KiB send buffer, small tensors
# first in a fusion group, momentum correction without full-size copies): the same two
# comparisons again, each started at load below 1.
dlcomm bench train --np 4 --emulate 4x1gbit --model mlp \
  --configs "none;topk:ratio=0.01,approx=1" --peers none --no-scaling \
  --repeats 3 --iters 3 --batches-per-iter 3 --warmup 3 --json $out/4x1_approx_afternoon.json > $out/4x1_approx_afternoon.log 2>&1
DLCOMM_HIERARCHICAL_RANKS_PER_HOST=2 dlcomm bench train --np 4 --emulate 2x1gbit --slots-per-host 2 --model mlp \
  --configs "none;topk:ratio=0.01,approx=1;htopk:ratio=0.01,approx=1" --peers none --no-scaling \
  --repeats 3 --iters 3 --batches-per-iter 3 --warmup 3 --json $out/2x2_approx_afternoon.json > $out/2x2_approx_afternoon.log 2>&1
