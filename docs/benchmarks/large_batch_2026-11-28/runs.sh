#!/bin/bash
# Every run of docs/large_batch.md (2026-11-28), in the order they ran; accuracy only.
# Usage, from anywhere in the checkout: OUT=large_batch bash runs.sh [stage ...]
# Stages: e200 (the 200-epoch sweep), e800 (seed 0 at 800 epochs), seeds (LAMB rates and
# seeds 1, 2 at 800 epochs), x16 (the script's defaults: 16x the batch at 30 epochs).
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-large_batch}
mkdir -p "$OUT"
run() {  # NAME ARGS...: one run of examples/large_batch.py, skipped when its JSON exists
  local name=$1; shift
  [ -f "$OUT/$name.json" ] && return
  dlcommrun -np 2 python examples/large_batch.py --dataset mnist --small-batch 256 \
    --max-micro-batch 4096 "$@" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
}

e200() {
  local E=200 B L W
  for L in 0.05 0.1 0.2; do for W in 20 50; do
    run lars_E${E}_B8192_L${L}_W$W --runs large:lars --large-batch 8192 --lars-lr $L --epochs $E --warmup-epochs $W
  done; done
  for L in 0.02 0.05 0.1; do for W in 20 50; do
    run lamb_E${E}_B8192_L${L}_W$W --runs large:lamb --large-batch 8192 --lamb-lr $L --epochs $E --warmup-epochs $W
  done; done
  run base_E$E --runs small:sgd --sgd-lr 0.08 --epochs $E
  for B in 16384 32768 65536; do
    for L in 0.025 0.05; do
      run lars_E${E}_B${B}_L${L}_W20 --runs large:lars --large-batch $B --lars-lr $L --epochs $E --warmup-epochs 20
    done
    for L in 0.02 0.01; do
      run lamb_E${E}_B${B}_L${L}_W50 --runs large:lamb --large-batch $B --lamb-lr $L --epochs $E --warmup-epochs 50
    done
  done
}

e800() {
  local E=800 W=80 B L
  run base_E$E --runs small:sgd --sgd-lr 0.08 --epochs $E
  for B in 65536 32768 16384 8192; do
    for L in 0.05 0.025; do
      run lars_E${E}_B${B}_L${L}_W$W --runs large:lars --large-batch $B --lars-lr $L --epochs $E --warmup-epochs $W
    done
    run lamb_E${E}_B${B}_L0.02_W$W --runs large:lamb --large-batch $B --lamb-lr 0.02 --epochs $E --warmup-epochs $W
  done
}

seeds() {
  local E=800 W=80 B L S
  for L in 0.005 0.01; do for B in 65536 32768 16384 8192; do
    run lamb_E${E}_B${B}_L${L}_W$W --runs large:lamb --large-batch $B --lamb-lr $L --epochs $E --warmup-epochs $W
  done; done
  for S in 1 2; do
    run base_E${E}_s$S --runs small:sgd --sgd-lr 0.08 --epochs $E --seed $S
    for B in 65536 32768 16384 8192; do
      run lars_E${E}_B${B}_L0.025_W${W}_s$S --runs large:lars --large-batch $B --lars-lr 0.025 --epochs $E --warmup-epochs $W --seed $S
    done
  done
}

x16() {  # the script's own defaults (batch 64 against 1024, 30 epochs)
  dlcommrun -np 2 python examples/large_batch.py --dataset mnist --json "$OUT/x16_defaults.json" \
    > "$OUT/x16_defaults.log" 2>&1
}

for stage in "${@:-e200 e800 seeds x16}"; do
  for s in $stage; do "$s"; done
done
