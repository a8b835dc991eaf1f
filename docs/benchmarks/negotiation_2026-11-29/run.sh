#!/bin/bash
# The measurements behind docs/collectives.md "Negotiation over the mesh" and docs/kfac.md
# (2026-11-29). Run from the repository root on a quiet machine (load below 1 before each).
D=docs/benchmarks/negotiation_2026-11-29

# CPU per wake-up of a polling wait (one second per sleep length).
dlcommrun -np 2 --emulate 2x1gbit python $D/wakeup_cost.py | tee $D/wakeup_cost.log

# K-FAC against kfac-pytorch: the new default ("new") alternating with the code before it
# ("old": commit 029013e checked out in /tmp/kt/old, its dlcomm/ first on PYTHONPATH; the
# compiled dlcomm/_native*.so copied in; frameworks/torch is unchanged between the two).
rm -rf ~/.cache/dlcomm/allreduce
for run in new1 old1 new2 old2 new3 old3 new4; do
  if [[ $run == old* ]]; then export PYTHONPATH=/tmp/kt/old; else unset PYTHONPATH; fi
  dlcomm bench kfac --np 4 --emulate 4x1gbit --peer-path /work/peers/kfac-site --epochs 3 \
      --repeats 3 --json $D/kfac_4x1gbit_$run.json > $D/kfac_4x1gbit_$run.log 2>&1
done
unset PYTHONPATH

# The same on shared memory (one host), alternating.
for run in new1 old1 new2 old2 new3; do
  if [[ $run == old* ]]; then export PYTHONPATH=/tmp/kt/old; else unset PYTHONPATH; fi
  dlcomm bench kfac --np 4 --peer-path /work/peers/kfac-site --epochs 3 --repeats 3 \
      --json $D/kfac_shm_$run.json > $D/kfac_shm_$run.log 2>&1
done
unset PYTHONPATH
# (The "new" runs above were measured at commit d6f41ef, whose rule applied on one crowded
# host too; since the next commit one host runs as "old".)

# Dense and fp16 training against DDP.
dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --configs "none;fp16" --iters 12 \
    --batches-per-iter 1 --warmup 5 --repeats 3 --no-scaling --json $D/dense_fp16_4x1gbit.json \
    > $D/dense_fp16_4x1gbit.log 2>&1
