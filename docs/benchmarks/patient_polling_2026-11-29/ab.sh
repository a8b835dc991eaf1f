#!/bin/bash
# A/B of sets of dlcomm files: each STATE_DIR holds copies named with '_' for '/' (FILES
# below). Alternating rounds, top-k at 1% on the emulated 4x1gbit, 30 timed iterations.
# Usage: ab.sh OUTDIR ROUNDS STATE_DIR...
set -u
OUT=$1; ROUNDS=$2; shift 2
FILES="${FILES:-dlcomm/compression/base.py dlcomm/compression/error_feedback.py dlcomm/compression/exchange.py dlcomm/compression/payload_cast.py dlcomm/compression/sparsify.py dlcomm/engine/operations/compressed_allreduce.py dlcomm/kernels.py}"
cd "$(git rev-parse --show-toplevel)"
mkdir -p $OUT /tmp/ab_backup
for f in $FILES; do cp $f /tmp/ab_backup/$(echo $f | tr / _); done
for round in $(seq 1 $ROUNDS); do
  for state in "$@"; do
    side=$(basename $state)
    for f in $FILES; do cp $state/$(echo $f | tr / _) $f; done
    rm -rf ~/.cache/dlcomm/allreduce
    echo "round $round $side $(uptime)" >> $OUT/ab.out
    dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --peers none \
      --configs "${CONFIGS:-topk:ratio=0.01,approx=1}" --iters ${ITERS:-30} --batches-per-iter 1 --warmup 5 \
      --repeats 1 --no-scaling --json $OUT/${side}_$round.json > $OUT/${side}_$round.log 2>&1
    grep -a "^| \`" $OUT/${side}_$round.log >> $OUT/ab.out
  done
done
for f in $FILES; do cp /tmp/ab_backup/$(echo $f | tr / _) $f; done
