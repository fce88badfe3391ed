#!/usr/bin/env bash
# `jumbo plan --finetune` (docs/plan.md "Fine-tuning"): without --nodes, the fewest nodes that
# fit; LoRA's heading, adapter count and adapter-only checkpoint, its frozen-base column; a full
# fine-tune's heading and pre-training's storage lines; bad values one line, exit 2.
# Usage: finetune_lines.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure

model="$repo/inputs/models/j1-jumbo.toml"
"$jumbo" plan --model "$model" --gpu a100-80gb --finetune lora --lora-rank 16 >"$tmp/lora.txt" 2>&1 ||
  { cat "$tmp/lora.txt"; fail "--finetune lora"; }
for want in "^fewest nodes that fit: 1 x p4de.24xlarge = 8 x A100-SXM4-80GB" \
            ", LoRA fine-tune$" \
            "^LoRA fine-tune, rank 16 on qkv, proj, fc1, fc2 of every layer: 268959744 adapter parameters" \
            "^adapter-only checkpoint: 3.23 GB (3227516928 bytes) with the f32 master and Adam m, v" \
            "1.08 GB (1075838976 bytes) with the f32 master alone" \
            "|   base weights  grads  optim" "frozen base 4[0-9].[0-9], adapter weights"; do
  grep -q -- "$want" "$tmp/lora.txt" || { cat "$tmp/lora.txt"; fail "lora: no line: $want"; }
done
grep -q "^storage:" "$tmp/lora.txt" && { cat "$tmp/lora.txt"; fail "lora: pre-training's storage lines"; }
echo "ok   --finetune lora: 1 node, 268959744 adapter parameters, the adapter-only checkpoint"

"$jumbo" plan --model "$model" --gpu a100-80gb --finetune full >"$tmp/full.txt" 2>&1 ||
  { cat "$tmp/full.txt"; fail "--finetune full"; }
nodes=$(sed -n 's/^fewest nodes that fit: \([0-9]*\) x .*/\1/p' "$tmp/full.txt")
(( nodes > 1 )) || { cat "$tmp/full.txt"; fail "full: fewest nodes $nodes, expected more than LoRA's 1"; }
grep -q ", full fine-tune$" "$tmp/full.txt" && grep -q "^full fine-tune: the memory of pre-training" "$tmp/full.txt" &&
  grep -q "^storage: one checkpoint of" "$tmp/full.txt" || { cat "$tmp/full.txt"; fail "full: heading, storage"; }
# The same plan as pre-training's on those nodes, but for the heading's words.
"$jumbo" plan --model "$model" --gpu a100-80gb --nodes "$nodes" >"$tmp/pre.txt" 2>&1 ||
  { cat "$tmp/pre.txt"; fail "pre-training on $nodes nodes"; }
diff <(sed -e '/^fewest nodes/d' -e '/^full fine-tune:/d' -e 's/, full fine-tune$//' "$tmp/full.txt") \
  "$tmp/pre.txt" ||
  fail "full fine-tune differs from pre-training's plan"
echo "ok   --finetune full: $nodes nodes, pre-training's plan"

# bad_flag ARGS... EXPECTED: exit 2, one line naming the flag, the value and the choices.
bad_flag() {
  local expected=${*: -1}
  "$jumbo" plan --model "$model" "${@:1:$#-1}" >"$tmp/err.txt" 2>&1
  local status=$?
  [[ $status -eq 2 && $(wc -l <"$tmp/err.txt") -eq 1 ]] && grep -q -- "$expected" "$tmp/err.txt" ||
    { cat "$tmp/err.txt"; fail "$*: status $status"; }
}
bad_flag --finetune qlora "--finetune qlora: expected full or lora"
bad_flag --finetune lora --lora-targets qkv,attn "--lora-targets qkv,attn: expected \"all\" or a comma-separated list of qkv, q, k, v, proj, fc1, gate, up, fc2"
bad_flag --finetune lora --lora-targets qkv,qkv "--lora-targets qkv,qkv: expected"
# A Llama's up maps are gate and up: fc1 names a GELU MLP's.
"$jumbo" plan --model inputs/models/llama3-8b.toml --gpu h100-80gb --finetune lora \
  --lora-targets q,v,fc1 >"$tmp/err.txt" 2>&1
[[ $? -eq 2 && $(wc -l <"$tmp/err.txt") -eq 1 ]] &&
  grep -q -- '--lora-targets q,v,fc1: fc1 with model.mlp = "swiglu": expected gate and up' "$tmp/err.txt" ||
  { cat "$tmp/err.txt"; fail "plan --lora-targets fc1 on a Llama"; }
bad_flag --finetune lora --lora-rank 0 "--lora-rank 0: expected >= 1"
bad_flag --lora-rank 8 --nodes 2 "--lora-rank and --lora-targets need --finetune lora"
bad_flag --finetune lora --storage "--storage sizes a pre-training checkpoint"
bad_flag "give --nodes N"
echo "ok   errors: one line, exit 2"
finish
