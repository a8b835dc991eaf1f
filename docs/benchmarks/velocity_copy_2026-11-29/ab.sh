#!/bin/bash
# A/B of error feedback's momentum correction copying each reduced result (old: b63426f)
# against keeping decompress_all's new array (new: e45d105), alternating, on 4x1gbit (or, with
# a fourth argument "shm", on shared memory: results shm_*).
# Usage: ab.sh OLD.py NEW.py OUTDIR [shm] (the two versions of
# dlcomm/compression/error_feedback.py); run from the repository root with the package
# installed editable (the script swaps the file).
set -u
old=$1; new=$2; out=$3; where=${4:-4x1gbit}
if [ "$where" = shm ]; then emulate=""; prefix=shm; else emulate="--emulate $where"; prefix=ab; fi
CMD="dlcomm bench train --np 4 $emulate --model mlp --peers none --no-scaling --configs none;topk:ratio=0.01,approx=1 --iters 12 --batches-per-iter 1 --warmup 5 --repeats 2"
for round in 1 2; do
  for v in new old; do
    while [ "$(awk '{print ($1 < 1.0)}' /proc/loadavg)" = 0 ]; do sleep 10; done
    if [ $v = old ]; then cp "$old" dlcomm/compression/error_feedback.py; else cp "$new" dlcomm/compression/error_feedback.py; fi
    rm -rf ~/.cache/dlcomm/allreduce
    echo "== $v round $round $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    $CMD --json "$out/${prefix}_${v}_$round.json" > "$out/${prefix}_${v}_$round.log" 2>&1
    grep "^| \`" "$out/${prefix}_${v}_$round.log"
  done
done
cp "$new" dlcomm/compression/error_feedback.py
