#!/bin/bash
# Issue 19: the engine's batching waits for a bucket's worth of dense bytes (until its
# deadline) instead of ending on a quiet queue. A/B of dlcomm/engine/engine.py: OLD and NEW
# are copies of the file; runs alternate old, new, old, new; each run is dlcomm bench train
# with DDP as peer on the emulated cluster (or shared memory with SHM=1).
# Usage: ab.sh OLD NEW OUTDIR
set -u
OLD=$1; NEW=$2; OUT=$3
cd "$(git rev-parse --show-toplevel)"
mkdir -p $OUT
cp dlcomm/engine/engine.py /tmp/engine_backup.py
EMU="--emulate 4x1gbit"; [ "${SHM:-0}" = 1 ] && EMU=""
for round in 1 2; do
  for side in old new; do
    src=$OLD; [ $side = new ] && src=$NEW
    cp $src dlcomm/engine/engine.py
    rm -rf ~/.cache/dlcomm/allreduce
    echo "round $round $side $(uptime)" >> $OUT/ab.out
    dlcomm bench train --np 4 $EMU --model mlp --configs "none;fp16" --peers ddp \
      --iters 12 --batches-per-iter 1 --warmup 5 --repeats 1 --no-scaling \
      --json $OUT/${side}_$round.json > $OUT/${side}_$round.log 2>&1
    grep -a "^| \`" $OUT/${side}_$round.log >> $OUT/ab.out
  done
done
cp /tmp/engine_backup.py dlcomm/engine/engine.py
