#!/bin/bash
# ab_env.sh OUT ROUNDS CONFIGS PEERS : alternate DLCOMM_TCP_MESH_MOVER=threads/native
OUT=$1; ROUNDS=$2; CONFIGS=$3; PEERS=${4:-none}; ITERS=${ITERS:-20}
mkdir -p $OUT
for r in $(seq 1 $ROUNDS); do
  for m in threads native; do
    rm -rf ~/.cache/dlcomm/allreduce
    echo "round $r $m $(uptime)" >> $OUT/ab.out
    DLCOMM_TCP_MESH_MOVER=$m dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --peers $PEERS \
      --configs "$CONFIGS" --iters $ITERS --batches-per-iter 1 --warmup 5 --repeats 1 --no-scaling \
      --json $OUT/${m}_$r.json > $OUT/${m}_$r.log 2>&1
    grep -a "^| \`" $OUT/${m}_$r.log >> $OUT/ab.out
  done
done
