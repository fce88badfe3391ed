#!/usr/bin/env bash
# Scaling runs over `mpirun -np`: one result line per layout.
#   scripts/scaling.sh strong  [MODEL]  fixed global batch, more ranks (efficiency = speed-up / ranks)
#   scripts/scaling.sh weak    [MODEL]  global batch grows with the ranks (efficiency = per-rank rate kept)
#   scripts/scaling.sh memory  [MODEL]  one job size, tp x pp from 1 to 8: memory per rank falls
# MODEL defaults to inputs/models/tiny.toml (with 8 layers and 8 heads, so tp and pp up to 8). Uses a small Brown tokenizer and dataset it makes
# in build/scaling/. Numbers on a 2-core machine measure the code paths, not a cluster.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${1:-strong}
model=${2:-inputs/models/tiny.toml}
jumbo=${JUMBO:-build/jumbo}
work=build/scaling
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$work"
if [[ ! -f $work/tok.model ]]; then
  "$jumbo" data tokenizer --input inputs/data/brown-valid.jsonl --output "$work/tok" \
    --vocab-size 500 --input-sentence-size 2000 --threads 1 >/dev/null
fi
[[ -f $work/data.bin ]] || "$jumbo" data prepare --input inputs/data/brown-train.jsonl \
  --tokenizer "$work/tok.model" --output "$work/data" >/dev/null

# run NP TP PP GLOBAL_BATCH -> "tokens_per_s mem_line"
run() {
  local np=$1 tp=$2 pp=$3 batch=$4 metrics="$work/metrics-$1-$2-$3-$4.jsonl"
  rm -f "$metrics"
  mpirun -np "$np" "$jumbo" train --set "model.preset=$model" --set model.vocab=1024 --set model.layers=8 --set model.heads=8 \
    --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.micro_batch=1 \
    --set train.steps=6 --set train.global_batch="$batch" --set train.eval_every=0 \
    --set "data.train=$work/data" --set data.valid= --set "data.tokenizer=$work/tok.model" \
    --set "log.metrics_file=$metrics" --set log.every=100 --set log.peak_tflops=1 >"$work/log" 2>&1 ||
    { cat "$work/log"; exit 1; }
  # Median tokens/s of steps 2..6 (step 1 warms caches and scratch).
  local rate mem
  rate=$(python3 -c '
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
print(round(statistics.median(r["tokens_per_s"] for r in rows)))' "$metrics")
  mem=$(grep -o "memory per rank: .*;" "$work/log" | head -1 | sed 's/;$//')
  echo "$rate|$mem"
}

case $mode in
  strong | weak)
    base=
    for np in 1 2 4 8; do
      batch=$([[ $mode == strong ]] && echo 32 || echo $((8 * np)))
      out=$(run "$np" 1 1 "$batch")
      rate=${out%%|*}
      base=${base:-$rate}
      if [[ $mode == strong ]]; then
        eff=$(python3 -c "print(f'{$rate / ($base * $np):.2f}')")
      else
        eff=$(python3 -c "print(f'{$rate / ($base * $np):.2f}')")
      fi
      echo "$mode np=$np layout=(1,1,$np) global_batch=$batch tokens/s=$rate efficiency=$eff"
    done
    ;;
  memory)
    for layout in "1 1" "2 1" "1 2" "2 2" "4 2" "2 4" "8 1" "1 8"; do
      read -r tp pp <<<"$layout"
      out=$(run 8 "$tp" "$pp" 32)
      echo "memory np=8 layout=($tp,$pp,$((8 / (tp * pp)))) tokens/s=${out%%|*} rank 0 ${out#*|}"
    done
    ;;
  *) echo "usage: scripts/scaling.sh strong|weak|memory [MODEL]" >&2; exit 2 ;;
esac
