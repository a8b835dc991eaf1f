#!/bin/bash
# accuracy sweep for 8k+ batches (accuracy only)
cd "$(git rev-parse --show-toplevel)"
mkdir -p ${OUT:-large_batch}
for E in 200; do
 for B in 8192; do
  for L in 0.05 0.1 0.2; do
   for W in 20 50; do
    dlcommrun -np 2 python examples/large_batch.py --dataset mnist --runs large:lars --small-batch 256 --large-batch $B --max-micro-batch 4096 --lars-lr $L --epochs $E --warmup-epochs $W --json ${OUT:-large_batch}/lars_E${E}_B${B}_L${L}_W${W}.json > ${OUT:-large_batch}/lars_E${E}_B${B}_L${L}_W${W}.log 2>&1
   done
  done
  for L in 0.02 0.05 0.1; do
   for W in 20 50; do
    dlcommrun -np 2 python examples/large_batch.py --dataset mnist --runs large:lamb --small-batch 256 --large-batch $B --max-micro-batch 4096 --lamb-lr $L --epochs $E --warmup-epochs $W --json ${OUT:-large_batch}/lamb_E${E}_B${B}_L${L}_W${W}.json > ${OUT:-large_batch}/lamb_E${E}_B${B}_L${L}_W${W}.log 2>&1
   done
  done
 done
 dlcommrun -np 2 python examples/large_batch.py --dataset mnist --runs small:sgd --small-batch 256 --sgd-lr 0.08 --epochs $E --json ${OUT:-large_batch}/base_E${E}.json > ${OUT:-large_batch}/base_E${E}.log 2>&1
done
echo done > ${OUT:-large_batch}/sweep.done
