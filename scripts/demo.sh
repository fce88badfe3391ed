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

source scripts/demo-data.sh
demo_build
demo_data

# The binary embeds inputs/runs/demo.toml, which reads build/demo/.
paths=()
if [[ $demo != build/demo ]]; then
  paths=(--set "data.train=$demo/brown-train" --set "data.valid=$demo/brown-valid"
         --set "data.tokenizer=$demo/brown-4k.model" --set "log.metrics_file=$demo/metrics.jsonl")
fi
exec "$jumbo" train "${paths[@]}" "$@"
