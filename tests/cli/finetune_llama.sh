#!/usr/bin/env bash
# LoRA on a Llama-family model (tiny-llama: RMSNorm, RoPE, SwiGLU, 4 query heads on 2 kv heads,
# untied head), on every map as PEFT names them (finetune.lora_targets = "all": q, k, v, o,
# gate, up, down):
#   - the run names its frozen base and the seven maps, and its first step is the base's loss;
#   - `jumbo ckpt merge` (q, k, v into their rows of the grouped q/k/v weight, gate and up into
#     their own) gives the model the adapters give: eval of the merged checkpoint equals
#     `eval --adapter` on the base, on one rank and on tp 2 x pp 2, within 1e-5;
#   - the manifest records the block: a GPT run cannot start from the Llama checkpoint, and
#     the hf-gpt2 export refuses it (exit 2, one line naming what differs).
# Usage: finetune_llama.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
source tests/support/expect_error.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
py=/usr/bin/python3
export OMPI_MCA_rmaps_base_oversubscribe=1
llama=(--set model.preset=inputs/models/tiny-llama.toml --set model.vocab=500)

train_small "$jumbo" 1 "$tmp" "${llama[@]}" --set train.steps=60 --set train.global_batch=8 \
  --set train.lr=3e-3 --set train.warmup_tokens=0 --set checkpoint.every=60 \
  --set "checkpoint.dir=$tmp/base" >"$tmp/base.log" 2>&1 ||
  { cat "$tmp/base.log"; fail "base training run"; finish; }
tail -1 "$tmp/base.log"

train_small "$jumbo" 1 "$tmp" "${llama[@]}" --set "train.init_from=$tmp/base" \
  --set finetune.method=lora --set finetune.lora_rank=4 --set finetune.lora_alpha=8 \
  --set train.steps=4 --set train.global_batch=8 --set train.lr=3e-3 --set train.warmup_tokens=0 \
  --set checkpoint.every=4 --set "checkpoint.dir=$tmp/lora" \
  --set "log.metrics_file=$tmp/lora.jsonl" >"$tmp/lora.log" 2>&1 ||
  { cat "$tmp/lora.log"; fail "LoRA run"; finish; }
grep -q "init_from: the frozen base .*base/step_00000060.* LoRA rank 4 on proj, fc2, q, k, v, gate, up" "$tmp/lora.log" ||
  { grep init_from "$tmp/lora.log"; fail "the LoRA run does not name its base and the seven maps"; }

check "merge" "$jumbo" ckpt merge --adapter "$tmp/lora" -o "$tmp/merged" >"$tmp/merge.log"
cat "$tmp/merge.log"
evaluate() {  # NAME NP ARGS...: eval's JSON line
  local name=$1 np=$2
  shift 2
  OMP_NUM_THREADS=1 mpirun -np "$np" "$jumbo" eval --data "$tmp/data" --windows 4 "$@" \
    >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "eval $name"; }
}
evaluate merged 1 --checkpoint "$tmp/merged"
evaluate adapter 1 --checkpoint "$tmp/base" --adapter "$tmp/lora"
evaluate adapter4 4 --checkpoint "$tmp/base" --adapter "$tmp/lora" --tp 2 --pp 2
evaluate base 1 --checkpoint "$tmp/base"
$py - "$tmp/merged.log" "$tmp/adapter.log" "$tmp/adapter4.log" "$tmp/base.log" <<'PY' ||
import json, sys
merged, one, grid, base = (json.loads(open(f).read().strip().splitlines()[-1])["data"]["loss"]
                           for f in sys.argv[1:5])
for got in (one, grid):
    assert abs(got - merged) <= 1e-5 * abs(merged), (got, merged)
assert abs(merged - base) > 1e-4, ("the adapters changed nothing", merged, base)
print(f"Llama LoRA: merged {merged!r} = eval --adapter {one!r} (tp 2 x pp 2 {grid!r}); base {base!r}")
PY
  fail "merged Llama LoRA differs from the adapters"

expect_error gpt_from_llama "the checkpoint's block is norm rmsnorm.*position rope.*says norm layernorm" \
  "$jumbo" train --set model.preset=inputs/models/tiny.toml --set model.layers=4 \
  --set model.vocab=500 --set model.ffn=192 --set "train.init_from=$tmp/base" \
  --set "data.train=$tmp/data" --set "data.tokenizer=$tmp/tok.model" --set data.valid= \
  --set train.eval_every=0
expect_error hf_gpt2_of_llama "hf-gpt2 writes GPT-2's block.*norm rmsnorm, position rope, mlp swiglu" \
  "$jumbo" ckpt export "$tmp/base" --format hf-gpt2 -o "$tmp/hf"
finish
