#!/usr/bin/env bash
# Builds jumbo and trains the demo model on the shipped Brown corpus. The tokenizer and the
# tokenized corpus are made once, in build/demo/. Arguments go to `jumbo train`, e.g.
#   scripts/demo.sh --set train.steps=50
#   scripts/demo.sh --config inputs/runs/other.toml
# JUMBO_BUILD_DIR (default build) and JUMBO_DEMO_DIR (default build/demo) move the build and
# the demo's files; the end-to-end test uses them to run this very script in a temp dir.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${JUMBO_BUILD_DIR:-build}
demo=${JUMBO_DEMO_DIR:-build/demo}

bash scripts/install-deps.sh

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target jumbo -j2

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$demo"
jumbo="$build/jumbo"
source scripts/openblas-core.sh
openblas_core_for_this_cpu "$jumbo"

# 4096 unigram pieces, multi-word pieces allowed, trained on a seeded sample of 5000 of the
# 14908 training paragraphs: ~15 s instead of ~80 s for 1% more tokens.
if [[ ! -f $demo/brown-4k.model ]]; then
  echo "demo: training the tokenizer ($demo/brown-4k.model)"
  "$jumbo" data tokenizer --input inputs/data/brown-train.jsonl --output "$demo/brown-4k" \
    --vocab-size 4096 --input-sentence-size 5000 --threads 2
fi

for split in train valid; do
  if [[ ! -f $demo/brown-$split.parts || $demo/brown-4k.model -nt $demo/brown-$split.parts ]]; then
    echo "demo: tokenizing inputs/data/brown-$split.jsonl ($demo/brown-$split.parts)"
    "$jumbo" data prepare --input "inputs/data/brown-$split.jsonl" \
      --tokenizer "$demo/brown-4k.model" --output "$demo/brown-$split"
  fi
done

# The binary embeds inputs/runs/demo.toml, which reads build/demo/.
paths=()
if [[ $demo != build/demo ]]; then
  paths=(--set "data.train=$demo/brown-train" --set "data.valid=$demo/brown-valid"
         --set "data.tokenizer=$demo/brown-4k.model" --set "log.metrics_file=$demo/metrics.jsonl")
fi
exec "$jumbo" train "${paths[@]}" "$@"
