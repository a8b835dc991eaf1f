#!/bin/bash
# A/B(/C...) of versions of some dlcomm files in training on the emulated cluster: each
# STATE_DIR holds one copy of every file in FILES, named with '_' for '/'
# (dlcomm/comm/polling.py -> dlcomm_comm_polling.py). The states run one after the other in
# every round (alternating), with the all-reduce cost cache cleared before each job; the
# working tree's files are put back at the end. Never edit those files while it runs.
#
#   FILES="dlcomm/comm/polling.py" ab_files.sh OUTDIR ROUNDS STATE_DIR...
#
# Environment: FILES (required), CONFIGS (default "topk:ratio=0.01,approx=1"), ITERS
# (default 30), EMULATE (default 4x1gbit). Results: OUTDIR/ab.out, OUTDIR/STATE_ROUND.json
# and .log; summarise with ab_summary.py OUTDIR.
set -u
OUT=$1; ROUNDS=$2; shift 2
: "${FILES:?set FILES to the space-separated files the states replace}"
CONFIGS=${CONFIGS:-topk:ratio=0.01,approx=1}; ITERS=${ITERS:-30}; EMULATE=${EMULATE:-4x1gbit}
cd "$(git rev-parse --show-toplevel)"
BACKUP=$(mktemp -d)
mkdir -p "$OUT"
for f in $FILES; do cp "$f" "$BACKUP/$(echo "$f" | tr / _)"; done
for round in $(seq 1 "$ROUNDS"); do
  for state in "$@"; do
    side=$(basename "$state")
    for f in $FILES; do cp "$state/$(echo "$f" | tr / _)" "$f"; done
    rm -rf ~/.cache/dlcomm/allreduce
    echo "round $round $side $(uptime)" >> "$OUT/ab.out"
    dlcomm bench train --np 4 --emulate "$EMULATE" --model mlp --peers none \
      --configs "$CONFIGS" --iters "$ITERS" --batches-per-iter 1 --warmup 5 \
      --repeats 1 --no-scaling --json "$OUT/${side}_$round.json" > "$OUT/${side}_$round.log" 2>&1
    grep -a "^| \`" "$OUT/${side}_$round.log" >> "$OUT/ab.out"
  done
done
for f in $FILES; do cp "$BACKUP/$(echo "$f" | tr / _)" "$f"; done
