#!/bin/bash
cd "$(git rev-parse --show-toplevel)"
mkdir -p ${OUT:-large_batch}
run() { # name runs extra...
  local name=$1; shift
  [ -f ${OUT:-large_batch}/$name.json ] && return
  dlcommrun -np 2 python examples/large_batch.py --dataset mnist --small-batch 256 --max-micro-batch 4096 "$@" --json ${OUT:-large_batch}/$name.json > ${OUT:-large_batch}/$name.log 2>&1
}
for B in 16384 32768 65536; do
  for L in 0.025 0.05; do run lars_E200_B${B}_L${L}_W20 --runs large:lars --large-batch $B --lars-lr $L --epochs 200 --warmup-epochs 20; done
  run lamb_E200_B${B}_L0.02_W50 --runs large:lamb --large-batch $B --lamb-lr 0.02 --epochs 200 --warmup-epochs 50
  run lamb_E200_B${B}_L0.01_W50 --runs large:lamb --large-batch $B --lamb-lr 0.01 --epochs 200 --warmup-epochs 50
done
echo done > ${OUT:-large_batch}/sweep2.done
