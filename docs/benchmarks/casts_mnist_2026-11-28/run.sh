#!/bin/sh
# issue 17: the casts on the MNIST subset, six seeds, as docs/compression.md's digits table
for spec in none fp16 bf16; do
  for seed in 0 1 2 3 4 5; do
    DLCOMM_COMPRESSION=$spec dlcommrun -np 4 python examples/torch_digits.py --dataset mnist --seed $seed --json ./${spec}_${seed}.json > ./${spec}_${seed}.log 2>&1
  done
done
echo finished > ./done
