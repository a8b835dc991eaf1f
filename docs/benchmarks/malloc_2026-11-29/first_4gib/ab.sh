#!/bin/bash
# Issue 25: top-k at 1% against dense on 4x1gbit with and without glibc's malloc keeping its
# memory (GLIBC_TUNABLES, forwarded to every rank), alternating, two rounds.
# Usage: ab.sh OUTDIR
set -u
OUT=$1
cd "$(git rev-parse --show-toplevel)"
mkdir -p $OUT
TUNED=glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296
for round in 1 2; do
  for side in default tuned; do
    rm -rf ~/.cache/dlcomm/allreduce
    echo "round $round $side $(uptime)" >> $OUT/ab.out
    if [ $side = tuned ]; then export GLIBC_TUNABLES=$TUNED; else unset GLIBC_TUNABLES; fi
    dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --peers none \
      --configs "none;topk:ratio=0.01,approx=1" --iters 12 --batches-per-iter 1 --warmup 5 \
      --repeats 1 --no-scaling --json $OUT/${side}_$round.json > $OUT/${side}_$round.log 2>&1
    grep -a "^| \`" $OUT/${side}_$round.log >> $OUT/ab.out
  done
done
unset GLIBC_TUNABLES
