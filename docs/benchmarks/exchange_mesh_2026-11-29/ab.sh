#!/bin/bash
# A/B of the compressed exchange's all-gathers over MPI (old: b8f706d) against the data
# communicator's all-gather (new: over the TCP mesh where auto sends those bytes), alternating.
# Usage: ab.sh SRC OUTDIR, with SRC holding {process_sets,mpi_backend}_{old,new}.py; run from
# the repository root with the package installed editable (the script swaps the two files).
set -u
src=$1; out=$2
CMD="dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --peers none --no-scaling --configs none;topk:ratio=0.01,approx=1 --iters 12 --batches-per-iter 1 --warmup 5 --repeats 2"
for round in 1 2; do
  for v in new old; do
    while [ "$(awk '{print ($1 < 1.0)}' /proc/loadavg)" = 0 ]; do sleep 10; done
    cp "$src/process_sets_$v.py" dlcomm/engine/process_sets.py
    cp "$src/mpi_backend_$v.py" dlcomm/comm/mpi_backend.py
    rm -rf ~/.cache/dlcomm/allreduce
    echo "== $v round $round $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    $CMD --json "$out/ab_${v}_$round.json" > "$out/ab_${v}_$round.log" 2>&1
    grep "^| \`" "$out/ab_${v}_$round.log"
  done
done
cp "$src/process_sets_new.py" dlcomm/engine/process_sets.py
cp "$src/mpi_backend_new.py" dlcomm/comm/mpi_backend.py
