#!/bin/bash
# Issue 24: hybrid fp16 all-reduce vs flat fp32 ring on 2 emulated hosts x 2 slots, 1 Gbit/s.
# 3 alternating rounds of: flat float32 ring (25 MiB), hierarchical float16 (12.5 MiB, float32
# accumulation, the default), hierarchical float16 with float16 accumulation.
cd "$(git rev-parse --show-toplevel)"
out=${OUT:-hybrid_allreduce}; mkdir -p $out
uptime > $out/uptime_start.txt
for round in 1 2 3; do
  DLCOMM_ALLREDUCE_ALGORITHM=ring dlcommrun --emulate 2x1gbit --slots-per-host 2 \
    dlcomm bench allreduce -b 25M -e 25M -d float32 -w 1 -n 6 --json $out/flat_fp32_$round.json > $out/flat_fp32_$round.log 2>&1
  DLCOMM_ALLREDUCE_ALGORITHM=hierarchical DLCOMM_HIERARCHICAL_RANKS_PER_HOST=2 dlcommrun --emulate 2x1gbit --slots-per-host 2 \
    dlcomm bench allreduce -b 12800K -e 12800K -d float16 -w 1 -n 6 --json $out/hybrid_fp16_$round.json > $out/hybrid_fp16_$round.log 2>&1
  DLCOMM_HIERARCHICAL_FP32_ACCUMULATION=0 DLCOMM_ALLREDUCE_ALGORITHM=hierarchical DLCOMM_HIERARCHICAL_RANKS_PER_HOST=2 dlcommrun --emulate 2x1gbit --slots-per-host 2 \
    dlcomm bench allreduce -b 12800K -e 12800K -d float16 -w 1 -n 6 --json $out/hybrid_fp16acc_$round.json > $out/hybrid_fp16acc_$round.log 2>&1
done
uptime > $out/uptime_end.txt
