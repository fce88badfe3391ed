#!/usr/bin/env bash
# The plan's CPU memory model against the measured peak of real runs: `jumbo train` prints
# "memory per rank: planned X ..., measured peak Y ...: Z%" at the end; every layout here must
# be within 5%. Usage: memory_vs_measured.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
# shellcheck source=tests/support/small_run.sh
source tests/support/small_run.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
# A model big enough that the runtime's ~27 MiB is small next to weights and activations.
shape=(--set model.d_model=512 --set model.layers=8 --set model.heads=8 --set model.context=256
  --set train.steps=2 --set train.global_batch=8)
check_layout() {  # check_layout NAME NP [--set ...]: the planned memory within 5% of the peak
  local name=$1 np=$2
  shift 2
  train_small "$jumbo" "$np" "$tmp" "${shape[@]}" "$@" >"$tmp/log" 2>&1
  local line
  line=$(grep "^memory per rank: planned" "$tmp/log")
  local pct=${line##*: }
  pct=${pct%\%}
  if [[ -n $line ]] && python3 -c "import sys; sys.exit(0 if abs(float('$pct')) <= 5 else 1)"; then
    echo "ok   $name: $line"
  else
    fail "$name: ${line:-no memory line}"
    tail -5 "$tmp/log"
  fi
}
check_layout "1 rank fp32" 1 --set parallel.micro_batch=4
check_layout "1 rank bf16 selective" 1 --set parallel.micro_batch=4 --set train.precision=bf16 \
  --set parallel.recompute=selective
check_layout "tp 2 x pp 2 sequence parallel" 4 --set parallel.micro_batch=2 --set parallel.tp=2 \
  --set parallel.pp=2 --set parallel.sequence_parallel=true
check_layout "pp 2 x dp 2 ZeRO-1 full recompute" 4 --set parallel.micro_batch=2 --set parallel.pp=2 \
  --set parallel.zero1=true --set parallel.recompute=full
check_layout "pp 4, 1F1B in flight" 4 --set parallel.micro_batch=1 --set parallel.pp=4
# The distributed optimizer: bf16 weights and f32 grads whole, master and Adam over dp 4.
check_layout "dp 4 ZeRO-1 bf16 (sharded master)" 4 --set parallel.micro_batch=2 --set parallel.zero1=true \
  --set train.precision=bf16
finish
