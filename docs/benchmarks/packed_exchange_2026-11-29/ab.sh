#!/bin/bash
# alternating A/B: new (installed, /work/main) and old (998148b worktree), same command
# OLD: a worktree of commit 998148b with the built native library copied in
cd "$(dirname "$0")"
CMD="dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --configs none;topk:ratio=0.01,approx=1;gtopk:ratio=0.01 --peers none --iters 12 --batches-per-iter 1 --warmup 5 --repeats 3 --no-scaling"
for round in 1 2; do
  for v in new old; do
    echo "== $v round $round $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    rm -rf ~/.cache/dlcomm/allreduce
    if [ $v = old ]; then
      PYTHONPATH=$OLD python -m dlcomm.cli.main ${CMD#dlcomm } --json ab_${v}_$round.json > ab_${v}_$round.log 2>&1
    else
      python -m dlcomm.cli.main ${CMD#dlcomm } --json ab_${v}_$round.json > ab_${v}_$round.log 2>&1
    fi
    grep "^| \`" ab_${v}_$round.log
  done
done
