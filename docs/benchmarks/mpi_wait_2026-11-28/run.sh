#!/bin/bash
# DLCOMM_MPI_WAIT (commit f85f3f6): what waiting by polling changes. Each command started at
# load below 1 with nothing else running (2026-11-28, 20:58-22:23 UTC).
cd "$(git rev-parse --show-toplevel)"
# Blocking waiters take the CPU of computing ranks (docs/collectives.md).
dlcommrun -np 4 --emulate 4x1gbit python docs/benchmarks/mpi_wait_2026-11-28/waiting_steals_cpu.py
# Dense and fp16 against DDP (docs/benchmarks.md), polling then blocking.
for wait in poll block; do
  DLCOMM_MPI_WAIT=$wait dlcomm bench train --np 4 --emulate 4x1gbit --model mlp --configs "none;fp16" \
    --iters 12 --batches-per-iter 1 --warmup 5 --repeats 3 --no-scaling \
    --json docs/benchmarks/mpi_wait_2026-11-28/dense_fp16_4x1gbit_$wait.json
done
# K-FAC against kfac-pytorch (docs/kfac.md), alternating poll and block, 7 runs in all, and
# one more poll run at d3c82ea (night5);
# files in docs/benchmarks/kfac_4x1gbit_2026-11-28/kfac_4x1gbit_{poll,block}_night*.
for wait in block poll poll block poll block poll; do
  DLCOMM_MPI_WAIT=$wait dlcomm bench kfac --np 4 --emulate 4x1gbit --peer-path /work/peers/kfac-site \
    --epochs 3 --repeats 3
done
# Small messages on idle ranks (docs/collectives.md): algorithms_poll_iallreduce.txt was taken
# while MPI's own all-reduce also polled (Iallreduce; since reverted), algorithms_block.txt
# with DLCOMM_MPI_WAIT=block, algorithms_poll.txt with the committed default.
for wait in poll block; do
  DLCOMM_MPI_WAIT=$wait DLCOMM_ALLREDUCE_MODEL_CACHE=off dlcommrun -np 4 --emulate 4x1gbit \
    python -m dlcomm.tools.bench.algorithms --sizes 8KiB 64KiB 256KiB --repeats 20
done
