#!/usr/bin/env bash
# jumbo generate on a real checkpoint: the same text (greedy, and sampled with a seed) on one
# rank and on tp 2 x pp 2, whatever the batch (--max-batch, --prefill-chunk); stop strings;
# one-line errors.
set -euo pipefail
jumbo=$1
cd "$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source tests/support/small_run.sh
make_small_data "$jumbo" "$work"
train_small "$jumbo" 1 "$work" --set train.steps=30 --set train.global_batch=8 \
  --set checkpoint.dir="$work/ckpt" --set checkpoint.every=30 >/dev/null
printf '%s\n' '{"prompt": "The jury said"}' '{"prompt": "It was the first time that"}' \
  '{"prompt": "In"}' >"$work/prompts.jsonl"
gen() {  # gen OUT [mpirun -np N] -- FLAGS...
  local out=$1
  shift
  "$@" --checkpoint "$work/ckpt" --prompts "$work/prompts.jsonl" --max-new-tokens 12 --json >"$out"
}
same() {
  cmp -s "$1" "$2" || { echo "FAIL: $1 and $2 differ"; diff "$1" "$2"; exit 1; }
}
gen "$work/g1" "$jumbo" generate
gen "$work/g2" mpirun -np 4 "$jumbo" generate --tp 2 --pp 2
gen "$work/g3" "$jumbo" generate --max-batch 1 --prefill-chunk 2
same "$work/g1" "$work/g2"
same "$work/g1" "$work/g3"
[[ $(wc -l <"$work/g1") -eq 3 ]] || { echo "FAIL: 3 completions expected"; exit 1; }
sampled=(--temperature 0.8 --top-k 40 --top-p 0.9 --seed 5)
gen "$work/s1" "$jumbo" generate "${sampled[@]}"
gen "$work/s2" mpirun -np 4 "$jumbo" generate --tp 2 --pp 2 "${sampled[@]}" --max-batch 2
gen "$work/s3" "$jumbo" generate --temperature 0.8 --top-k 40 --top-p 0.9 --seed 6
same "$work/s1" "$work/s2"
cmp -s "$work/s1" "$work/s3" && { echo "FAIL: seeds 5 and 6 gave the same text"; exit 1; }
cmp -s "$work/s1" "$work/g1" && { echo "FAIL: sampling gave the greedy text"; exit 1; }

# A stop string cut from the greedy text: the completion ends before it.
python3 - "$work/g1" "$work/stop.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if len(d["text"]) >= 6 and d["index"] == 0:
        open(sys.argv[2], "w").write(d["text"][3:6])
        break
PY
stop=$(cat "$work/stop.txt")
"$jumbo" generate --checkpoint "$work/ckpt" --prompt "The jury said" --max-new-tokens 12 \
  --stop "$stop" --json >"$work/st"
python3 - "$work/g1" "$work/st" "$stop" <<'PY'
import json, sys
full = json.loads(open(sys.argv[1]).readline())["text"]
cut = json.loads(open(sys.argv[2]).readline())
assert cut["finish_reason"] == "stop", cut
assert cut["text"] == full[: full.find(sys.argv[3])], (cut["text"], full, sys.argv[3])
PY
"$jumbo" generate --checkpoint "$work/ckpt" --prompt "The jury said" --max-new-tokens 4 | \
  grep -q "^The jury said" || { echo "FAIL: the human output repeats the prompt"; exit 1; }

expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1
  shift
  set +e
  "$jumbo" generate "$@" >"$work/out.txt" 2>"$work/err.txt"
  local code=$?
  set -e
  if [[ $code -ne 2 ]] || ! grep -q -- "$pattern" "$work/err.txt" || [[ $(wc -l <"$work/err.txt") -ne 1 ]]; then
    echo "FAIL: jumbo generate $* exited $code:"
    cat "$work/err.txt"
    exit 1
  fi
}
expect_error "exceed the model's context of 32" --checkpoint "$work/ckpt" --prompt "The jury" --max-new-tokens 40
expect_error "give --prompt TEXT or --prompts" --checkpoint "$work/ckpt"
echo 'not json' >"$work/bad.jsonl"
expect_error "bad.jsonl:1: expected a JSON object" --checkpoint "$work/ckpt" --prompts "$work/bad.jsonl"
expect_error "generation runs one model replica" --checkpoint "$work/ckpt" --prompt "a" --tp 2
expect_error "--max-batch 0" --checkpoint "$work/ckpt" --prompt "a" --max-batch 0
echo "generate: ok"
