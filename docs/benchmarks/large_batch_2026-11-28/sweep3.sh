#!/bin/bash
cd "$(git rev-parse --show-toplevel)"
mkdir -p ${OUT:-large_batch}
run() { local name=$1; shift
  [ -f ${OUT:-large_batch}/$name.json ] && return
  dlcommrun -np 2 python examples/large_batch.py --dataset mnist --small-batch 256 --max-micro-batch 4096 "$@" --json ${OUT:-large_batch}/$name.json > ${OUT:-large_batch}/$name.log 2>&1
}
E=800; W=80
run base_E$E --runs small:sgd --sgd-lr 0.08 --epochs $E
for B in 65536 32768 16384 8192; do
  for L in 0.05 0.025; do run lars_E${E}_B${B}_L${L}_W$W --runs large:lars --large-batch $B --lars-lr $L --epochs $E --warmup-epochs $W; done
  run lamb_E${E}_B${B}_L0.02_W$W --runs large:lamb --large-batch $B --lamb-lr 0.02 --epochs $E --warmup-epochs $W
done
echo done > ${OUT:-large_batch}/sweep3.done
