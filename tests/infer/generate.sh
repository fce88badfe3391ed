#!/usr/bin/env bash
# jumbo generate on a real checkpoint: the same text (greedy, and sampled with a seed) on one
# rank and on tp 2 x pp 2 (also under --comm-emulate nccl), whatever the batch (--max-batch,
# --prefill-chunk); stop strings;
# one-line errors.
source "$(dirname "$0")/../support/harness.sh" "$@"
abort_on_error
stop_at_first_failure
source tests/support/small_run.sh
make_small_data "$jumbo" "$tmp"
train_small "$jumbo" 1 "$tmp" --set train.steps=30 --set train.global_batch=8 \
  --set checkpoint.dir="$tmp/ckpt" --set checkpoint.every=30 >/dev/null
printf '%s\n' '{"prompt": "The jury said"}' '{"prompt": "It was the first time that"}' \
  '{"prompt": "In"}' >"$tmp/prompts.jsonl"
gen() {  # gen OUT [mpirun -np N] -- FLAGS...
  local out=$1
  shift
  "$@" --checkpoint "$tmp/ckpt" --prompts "$tmp/prompts.jsonl" --max-new-tokens 12 --json >"$out"
}
same() {
  cmp -s "$1" "$2" || { diff "$1" "$2"; fail "$1 and $2 differ"; }
}
gen "$tmp/g1" "$jumbo" generate
gen "$tmp/g2" mpirun -np 4 "$jumbo" generate --tp 2 --pp 2
gen "$tmp/g3" "$jumbo" generate --max-batch 1 --prefill-chunk 2
# Under NCCL's rules on CPU ranks (synchronous sends, tags ignored, one stream per group).
gen "$tmp/g4" mpirun -np 4 "$jumbo" generate --tp 2 --pp 2 --comm-emulate nccl
same "$tmp/g1" "$tmp/g2"
same "$tmp/g2" "$tmp/g4"
same "$tmp/g1" "$tmp/g3"
[[ $(wc -l <"$tmp/g1") -eq 3 ]] || fail "3 completions expected"
sampled=(--temperature 0.8 --top-k 40 --top-p 0.9 --seed 5)
gen "$tmp/s1" "$jumbo" generate "${sampled[@]}"
gen "$tmp/s2" mpirun -np 4 "$jumbo" generate --tp 2 --pp 2 "${sampled[@]}" --max-batch 2
gen "$tmp/s3" "$jumbo" generate --temperature 0.8 --top-k 40 --top-p 0.9 --seed 6
gen "$tmp/s4" mpirun -np 2 "$jumbo" generate --pp 2 "${sampled[@]}" --max-batch 2 --comm-emulate nccl
same "$tmp/s1" "$tmp/s2"
same "$tmp/s1" "$tmp/s4"
cmp -s "$tmp/s1" "$tmp/s3" && fail "seeds 5 and 6 gave the same text"
cmp -s "$tmp/s1" "$tmp/g1" && fail "sampling gave the greedy text"

# A stop string cut from the greedy text: the completion ends before it.
python3 - "$tmp/g1" "$tmp/stop.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if len(d["text"]) >= 6 and d["index"] == 0:
        open(sys.argv[2], "w").write(d["text"][3:6])
        break
PY
stop=$(cat "$tmp/stop.txt")
"$jumbo" generate --checkpoint "$tmp/ckpt" --prompt "The jury said" --max-new-tokens 12 \
  --stop "$stop" --json >"$tmp/st"
python3 - "$tmp/g1" "$tmp/st" "$stop" <<'PY'
import json, sys
full = json.loads(open(sys.argv[1]).readline())["text"]
cut = json.loads(open(sys.argv[2]).readline())
assert cut["finish_reason"] == "stop", cut
assert cut["text"] == full[: full.find(sys.argv[3])], (cut["text"], full, sys.argv[3])
PY
"$jumbo" generate --checkpoint "$tmp/ckpt" --prompt "The jury said" --max-new-tokens 4 | \
  grep -q "^The jury said" || fail "the human output repeats the prompt"

source tests/support/expect_error.sh
expect_error too_long "exceed the model's context of 32" "$jumbo" generate --checkpoint "$tmp/ckpt" --prompt "The jury" --max-new-tokens 40
expect_error no_prompt "give --prompt TEXT or --prompts" "$jumbo" generate --checkpoint "$tmp/ckpt"
echo 'not json' >"$tmp/bad.jsonl"
expect_error bad_prompts "bad.jsonl:1: expected a JSON object" "$jumbo" generate --checkpoint "$tmp/ckpt" --prompts "$tmp/bad.jsonl"
expect_error not_one_replica "generation runs one model replica" "$jumbo" generate --checkpoint "$tmp/ckpt" --prompt "a" --tp 2
expect_error bad_batch "--max-batch 0" "$jumbo" generate --checkpoint "$tmp/ckpt" --prompt "a" --max-batch 0
finish
