#!/bin/bash
cd "$(git rev-parse --show-toplevel)"
mkdir -p ${OUT:-large_batch}
run() { local name=$1; shift
  [ -f ${OUT:-large_batch}/$name.json ] && return
  dlcommrun -np 2 python examples/large_batch.py --dataset mnist --small-batch 256 --max-micro-batch 4096 "$@" --json ${OUT:-large_batch}/$name.json > ${OUT:-large_batch}/$name.log 2>&1
}
E=800; W=80
for L in 0.005 0.01; do
  for B in 65536 32768 16384 8192; do run lamb_E${E}_B${B}_L${L}_W$W --runs large:lamb --large-batch $B --lamb-lr $L --epochs $E --warmup-epochs $W; done
done
for S in 1 2; do
  run base_E${E}_s$S --runs small:sgd --sgd-lr 0.08 --epochs $E --seed $S
  for B in 65536 32768 16384 8192; do run lars_E${E}_B${B}_L0.025_W${W}_s$S --runs large:lars --large-batch $B --lars-lr 0.025 --epochs $E --warmup-epochs $W --seed $S; done
done
# the 16x table of docs/mixed_precision.md with the streamed batches (script defaults)
dlcommrun -np 2 python examples/large_batch.py --dataset mnist --json ${OUT:-large_batch}/x16_defaults.json > ${OUT:-large_batch}/x16_defaults.log 2>&1
echo done > ${OUT:-large_batch}/sweep4.done
