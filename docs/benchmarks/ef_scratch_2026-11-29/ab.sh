#!/bin/bash
# Issue 25: ef_select's output buffers reused per thread instead of allocated every call.
# A/B of dlcomm/kernels.py (OLD, NEW: copies of the file), alternating, two rounds, top-k at
# 1% against dense on the emulated 4x1gbit. Usage: ab.sh OLD NEW OUTDIR [extra bench args]
set -u
OLD=$1; NEW=$2; OUT=$3; shift 3
cd "$(git rev-parse --show-toplevel)"
mkdir -p $OUT
cp dlcomm/kernels.py /tmp/kernels_backup.py
for round in 1 2; do
  for side in old new; do
    src=$OLD; [ $side = new ] && src=$NEW
    cp $src dlcomm/kernels.py
    rm -rf ~/.cache/dlcomm/allreduce
    echo "round $round $side $(uptime)" >> $OUT/ab.out
    dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --peers none \
      --configs "none;topk:ratio=0.01,approx=1" --iters 12 --batches-per-iter 1 --warmup 5 \
      --repeats 1 --no-scaling "$@" --json $OUT/${side}_$round.json > $OUT/${side}_$round.log 2>&1
    grep -a "^| \`" $OUT/${side}_$round.log >> $OUT/ab.out
  done
done
cp /tmp/kernels_backup.py dlcomm/kernels.py
