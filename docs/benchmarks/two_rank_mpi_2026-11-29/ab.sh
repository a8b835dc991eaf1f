#!/bin/bash
# Issue 19: auto with MPI's own all-reduce among its candidates between two ranks. A/B of
# dlcomm/collectives/selection.py (OLD, NEW: copies of the file), alternating, two rounds;
# each run removes the cached cost model first so that it measures with its own candidates.
# Usage: ab.sh OLD NEW OUTDIR
set -u
OLD=$1; NEW=$2; OUT=$3
cd "$(git rev-parse --show-toplevel)"
mkdir -p $OUT
cp dlcomm/collectives/selection.py /tmp/selection_backup.py
for round in 1 2; do
  for side in old new; do
    src=$OLD; [ $side = new ] && src=$NEW
    cp $src dlcomm/collectives/selection.py
    rm -rf ~/.cache/dlcomm/allreduce
    echo "round $round $side $(uptime)" >> $OUT/ab.out
    dlcommrun -np 2 dlcomm bench allreduce --sizes 4K,256K,4M,64M --json $OUT/${side}_$round.json \
      > $OUT/${side}_$round.log 2>&1
    grep -E "^ +[0-9]+[KM]iB" $OUT/${side}_$round.log >> $OUT/ab.out
  done
done
cp /tmp/selection_backup.py dlcomm/collectives/selection.py
