#!/usr/bin/env bash
# Records what a refactoring of decoding or serving must not change: `jumbo generate --json`
# texts and tokens (greedy and sampled, several layouts and batch shapes, fp32 and bf16),
# `jumbo eval` numbers, and the completions `jumbo serve` answers, from one small checkpoint.
#   scripts/record-generation.sh OUT.txt [BUILD_DIR]
# Like record-losses.sh: run before and after on the same machine and `diff` the two files.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$(realpath -m "$1")
build=${2:-build}
jumbo=$(realpath "$build/jumbo")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
server_pid=
fail() { echo "record-generation: $*" >&2; exit 1; }
source tests/support/serve_harness.sh
trap 'stop_server_now; rm -rf "$tmp"' EXIT
data=$(realpath -m "$build/record-data")
source tests/support/small_run.sh
if [[ ! -f $data/data.parts ]]; then
  mkdir -p "$data"
  make_small_data "$jumbo" "$data"
fi
: >"$out"
train_small "$jumbo" 1 "$data" --set train.steps=30 --set train.global_batch=8 \
  --set checkpoint.dir="$tmp/ckpt" --set checkpoint.every=30 >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "training failed"; }
printf '%s\n' '{"prompt": "The jury said"}' '{"prompt": "It was the first time that"}' \
  '{"prompt": "In"}' '{"prompt": "The city of Atlanta"}' >"$tmp/prompts.jsonl"
gen() {  # gen NAME COMMAND... : the completions, named
  local name=$1
  shift
  "$@" --checkpoint "$tmp/ckpt" --prompts "$tmp/prompts.jsonl" --max-new-tokens 10 --json \
    >"$tmp/g" 2>"$tmp/err" || { cat "$tmp/err"; fail "$name failed"; }
  sed "s/^/$name /" "$tmp/g" >>"$out"
}
sampled=(--temperature 0.8 --top-k 40 --top-p 0.9 --seed 5)
gen greedy-1 "$jumbo" generate
gen greedy-tp2 mpirun -np 2 "$jumbo" generate --tp 2
gen greedy-pp2 mpirun -np 2 "$jumbo" generate --pp 2
gen greedy-tp2pp2 mpirun -np 4 "$jumbo" generate --tp 2 --pp 2
gen greedy-batch1-chunk2 "$jumbo" generate --max-batch 1 --prefill-chunk 2
gen greedy-bf16 "$jumbo" generate --precision bf16
gen greedy-bf16-tp2 mpirun -np 2 "$jumbo" generate --tp 2 --precision bf16 --prefill-chunk 3
gen sampled-1 "$jumbo" generate "${sampled[@]}"
gen sampled-tp2pp2 mpirun -np 4 "$jumbo" generate --tp 2 --pp 2 "${sampled[@]}" --max-batch 2
gen penalties-1 "$jumbo" generate --temperature 0.7 --seed 3 --frequency-penalty 0.5 \
  --presence-penalty 0.3

# Evaluation: the forward half of training on the validation data.
evaluate() {  # evaluate NAME COMMAND...
  local name=$1
  shift
  "$@" --checkpoint "$tmp/ckpt" --data "$data/data" --windows 6 --task inputs/tasks/brown-lastword.jsonl \
    --per-item "$tmp/items" >"$tmp/e" 2>"$tmp/err" || { cat "$tmp/err"; fail "$name failed"; }
  # The paths of the run and of the data are named TMP and DATA: two checkouts compare.
  grep -vE "seconds|tokens/s" "$tmp/e" | sed "s|$tmp|TMP|g; s|$data|DATA|g; s/^/$name /" >>"$out"
  sed "s/^/$name-item /" "$tmp/items" >>"$out"
}
evaluate eval-1 "$jumbo" eval
evaluate eval-tp2pp2 mpirun -np 4 "$jumbo" eval --tp 2 --pp 2

# The server's completions (greedy and seeded), over HTTP.
start_server serve "$jumbo" serve --checkpoint "$tmp/ckpt" --port 0 || fail "serve did not start"
model=$(curl -sf "http://127.0.0.1:$port/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
for body in '{"prompt": "The jury said", "max_tokens": 12, "temperature": 0}' \
  '{"prompt": ["In", "It was"], "max_tokens": 8, "temperature": 0.9, "seed": 7}' \
  '{"prompt": "The city", "max_tokens": 10, "logprobs": 2, "temperature": 0.5, "seed": 2}'; do
  body=${body/\{/\{\"model\": \"$model\", }
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "$body" | python3 -c 'import json,sys
d = json.load(sys.stdin)
for c in d["choices"]:
    print("serve", json.dumps(c, sort_keys=True))' >>"$out" || fail "serve: $body"
done
stop_server serve || fail "serve did not stop"
echo "record-generation: $(wc -l <"$out") lines in $out"
