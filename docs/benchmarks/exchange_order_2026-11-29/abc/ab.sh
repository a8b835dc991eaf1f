#!/bin/bash
# A/B/C of file sets (each state a folder of files named with '_' for '/'), alternating,
# top-k at 1% on the emulated 4x1gbit. Usage: ab.sh OUTDIR ROUNDS STATE_DIR...
set -u
OUT=$1; ROUNDS=$2; shift 2
cd "$(git rev-parse --show-toplevel)"
mkdir -p $OUT /tmp/ab_backup
FILES="dlcomm/compression/exchange.py dlcomm/comm/mpi_backend.py dlcomm/engine/process_sets.py"
for f in $FILES; do cp $f /tmp/ab_backup/$(echo $f | tr / _); done
for round in $(seq 1 $ROUNDS); do
  for state in "$@"; do
    side=$(basename $state)
    for f in $FILES; do cp $state/$(echo $f | tr / _) $f; done
    rm -rf ~/.cache/dlcomm/allreduce
    echo "round $round $side $(uptime)" >> $OUT/ab.out
    dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --peers none \
      --configs "topk:ratio=0.01,approx=1" --iters 30 --batches-per-iter 1 --warmup 5 \
      --repeats 1 --no-scaling --json $OUT/${side}_$round.json > $OUT/${side}_$round.log 2>&1
    grep -a "^| \`" $OUT/${side}_$round.log >> $OUT/ab.out
    for k in 0 1 2 3; do cp /tmp/cpu.$k $OUT/${side}_${round}_cpu$k.txt 2>/dev/null; done
  done
done
for f in $FILES; do cp /tmp/ab_backup/$(echo $f | tr / _) $f; done
