#!/bin/bash
# Top-k and dense on 4x1gbit under three code states, alternating:
#   A = 54483d9's polling and exchange; B = b8f706d's polling, the exchange's all-gathers on
#   MPI; C = b8f706d's polling, the exchange's all-gathers on the data communicator's.
# Usage: ab_topk.sh SRC OUTDIR (SRC: polling_{old,new}.py, process_sets_{old,new}.py,
# mpi_backend_{old,new}.py); run from the repository root, package installed editable.
set -u
src=$1; out=$2
CMD="dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --peers none --no-scaling --configs none;topk:ratio=0.01,approx=1 --iters 12 --batches-per-iter 1 --warmup 5 --repeats 2"
put() { cp "$src/polling_$1.py" dlcomm/comm/polling.py; cp "$src/process_sets_$2.py" dlcomm/engine/process_sets.py; cp "$src/mpi_backend_$2.py" dlcomm/comm/mpi_backend.py; }
for round in 1 2; do
  for v in A B C; do
    while [ "$(awk '{print ($1 < 1.0)}' /proc/loadavg)" = 0 ]; do sleep 10; done
    case $v in A) put old old;; B) put new old;; C) put new new;; esac
    rm -rf ~/.cache/dlcomm/allreduce
    echo "== $v round $round $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    $CMD --json "$out/topk_${v}_$round.json" > "$out/topk_${v}_$round.log" 2>&1
    grep "^| \`" "$out/topk_${v}_$round.log"
  done
done
put new new
