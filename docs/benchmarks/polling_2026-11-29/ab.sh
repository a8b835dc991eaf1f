#!/bin/bash
# A/B of wait_polling before (54483d9: time.sleep(0) spin, default timer slack) and after
# (b8f706d: sched_yield spin, 1 us slack while sleeping), alternating, on a quiet machine.
# Usage: ab.sh OLD_POLLING.py NEW_POLLING.py OUTDIR   (run from the repository root; the
# package must be installed editable, since the script swaps dlcomm/comm/polling.py).
set -u
old=$1; new=$2; out=$3
mkdir -p "$out"
cp dlcomm/comm/polling.py "$out/.polling_saved"
for round in 1 2; do
  for v in old new; do
    if [ $v = old ]; then cp "$old" dlcomm/comm/polling.py; else cp "$new" dlcomm/comm/polling.py; fi
    rm -rf ~/.cache/dlcomm/allreduce
    echo "== round $round $v load $(cut -d' ' -f1-3 /proc/loadavg)"
    for n in 2 4; do
      for alg in mpi auto; do
        DLCOMM_ALLREDUCE_ALGORITHM=$alg timeout 300 dlcommrun -np $n dlcomm bench latency \
          --json "$out/latency_np${n}_${alg}_${v}_${round}.json" | tail -2 | head -1
      done
    done
    timeout 300 dlcommrun -np 4 dlcomm bench fusion --tensors 200 --tensor-bytes 40000 -w 3 -n 30 \
      --block 10 --json "$out/fusion_np4_${v}_${round}.json" | tail -5
  done
done
cp "$out/.polling_saved" dlcomm/comm/polling.py && rm "$out/.polling_saved"
