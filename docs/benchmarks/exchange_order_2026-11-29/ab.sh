#!/bin/bash
# A/B of dlcomm/compression/exchange.py: each STATE_DIR holds one exchange.py. Alternating
# rounds, top-k at 1% on the emulated 4x1gbit (30 timed iterations per job).
# Usage: ab.sh OUTDIR ROUNDS STATE_DIR...
set -u
OUT=$1; ROUNDS=$2; shift 2
cd "$(git rev-parse --show-toplevel)"
mkdir -p $OUT
cp dlcomm/compression/exchange.py /tmp/exchange_backup.py
for round in $(seq 1 $ROUNDS); do
  for state in "$@"; do
    side=$(basename $state)
    cp $state/exchange.py dlcomm/compression/exchange.py
    rm -rf ~/.cache/dlcomm/allreduce
    echo "round $round $side $(uptime)" >> $OUT/ab.out
    dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --peers none \
      --configs "topk:ratio=0.01,approx=1" --iters 30 --batches-per-iter 1 --warmup 5 \
      --repeats 1 --no-scaling --json $OUT/${side}_$round.json > $OUT/${side}_$round.log 2>&1
    grep -a "^| \`" $OUT/${side}_$round.log >> $OUT/ab.out
  done
done
cp /tmp/exchange_backup.py dlcomm/compression/exchange.py
