#!/usr/bin/env bash
# The Llama family's CPU training step against the GPT family's at equal model FLOPs, in one
# run: `jumbo bench train` on gpt2-124m and on llama-124m (this directory: the Llama block
# with GPT-2 small's FLOPs per token), alternated ROUNDS times so that both see the same
# machine, each model's best MFU kept. Prints both and the ratio (the issue's bar: >= 0.95).
#   benchmarks/train/family_mfu.sh [JUMBO] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
jumbo=${1:-build/jumbo}
rounds=${2:-2}
args=(--seq 256 --micro-batch 4 --steps 3 --warmup 1)
source scripts/openblas-core.sh
openblas_core_for_this_cpu "$jumbo"
best() {  # the highest "MFU x%" of a bench train output
  grep -o 'MFU [0-9.]*%' | tr -d 'MFU %' | sort -g | tail -1
}
gpt=0 llama=0
for ((r = 1; r <= rounds; r++)); do
  g=$("$jumbo" bench train -m inputs/models/gpt2-124m.toml "${args[@]}" | tee /dev/stderr | best)
  l=$("$jumbo" bench train -m benchmarks/train/llama-124m.toml "${args[@]}" | tee /dev/stderr | best)
  gpt=$(python3 -c "print(max($gpt, $g))")
  llama=$(python3 -c "print(max($llama, $l))")
done
python3 - "$gpt" "$llama" <<'PY'
import sys
gpt, llama = map(float, sys.argv[1:])
print(f"MFU at equal model FLOPs (7.98e8 per token): gpt2-124m {gpt:.1f}%, llama-124m {llama:.1f}%: "
      f"Llama / GPT = {llama / gpt:.3f}")
PY
