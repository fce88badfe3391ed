#!/usr/bin/env bash
# Builds jumbo and trains the demo model on the shipped Brown corpus. The tokenizer and the
# tokenized corpus are made once, in build/demo/. Arguments go to `jumbo train`, e.g.
#   scripts/demo.sh --set train.steps=50
#   scripts/demo.sh --config inputs/runs/other.toml
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build --target jumbo -j2

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p build/demo

if [[ ! -f build/demo/brown-4k.model ]]; then
  echo "demo: training the tokenizer (build/demo/brown-4k.model)"
  build/jumbo data tokenizer --input inputs/data/brown-train.jsonl --output build/demo/brown-4k \
    --vocab-size 4096 --input-sentence-size 100000
fi

for split in train valid; do
  if [[ ! -f build/demo/brown-$split.bin ]]; then
    echo "demo: tokenizing inputs/data/brown-$split.jsonl (build/demo/brown-$split.bin)"
    build/jumbo data prepare --input "inputs/data/brown-$split.jsonl" \
      --tokenizer build/demo/brown-4k.model --output "build/demo/brown-$split"
  fi
done

# The binary embeds inputs/runs/demo.toml, which reads build/demo/.
exec build/jumbo train "$@"
