#!/usr/bin/env bash
# Builds jumbo and trains the demo model on the shipped Brown corpus. The tokenizer and the
# tokenized corpus are made once, in build/demo/. The trained model is kept as the checkpoint
# of the last step in build/demo/checkpoints/, made afresh by each run (the directory is
# removed first, unless the arguments set their own checkpoint.dir or a checkpoint.resume;
# scripts/finetune-demo.sh takes it as its base). The script ends by printing the commands
# that try the model: jumbo generate, jumbo serve, and a curl request to that server.
# Arguments go to `jumbo train` and win over the script's --set, e.g.
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

# The checkpoint: the last step's only (checkpoint.every beyond any demo's steps), in a fresh
# directory, so that a rerun never meets the previous run's checkpoints.
ckpt=$demo/checkpoints
fresh=1
for arg in "$@"; do
  case $arg in
    *checkpoint.dir=*) ckpt=${arg#*checkpoint.dir=}; fresh=0 ;;
    *checkpoint.resume=*) fresh=0 ;;
  esac
done
((fresh == 0)) || rm -rf "$ckpt"
"$jumbo" train "${paths[@]}" --set "checkpoint.dir=$ckpt" --set checkpoint.every=1000000 "$@"

[[ -n $ckpt && -f $ckpt/latest ]] || exit 0  # `--set checkpoint.dir=`: nothing was saved
# The paths as this script used them: relative ones are relative to the repository root.
q() { printf '%q' "$1"; }
cat <<EOF

demo: the trained model is $ckpt/$(cat "$ckpt/latest") (the next demo run replaces it).
Try it, from the repository root ($(pwd)):
  $(q "$jumbo") generate --checkpoint $(q "$ckpt") --prompt "The jury said" --max-new-tokens 40
  $(q "$jumbo") serve --checkpoint $(q "$ckpt") --model-name demo
and, while it serves, from another terminal (/v1/completions: the demo model has no chat template):
  curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "demo", "prompt": "The jury said", "max_tokens": 40}'
EOF
