#!/usr/bin/env bash
# `jumbo ckpt export --format hf-gpt2` read back by an independent GPT-2 (torch_gpt2.py,
# written from GPT-2's published layout, not from jumbo's code):
#   - config.json's fields, GPT-2's tensor names, dtypes and shapes (vocab_size = model.vocab:
#     the run pads 500 to 512 rows), the tokenizer files;
#   - the bf16 export is the f32 one rounded to nearest even;
#   - the same checkpoint converted to dp 2 ZeRO-1 (pieces cut inside rows) exports the same;
#   - the exported model's mean loss over jumbo's validation windows equals the val_loss the
#     trainer logged for the checkpoint's weights (and is far below ln(vocab));
#   - per task item and continuation, the log-likelihood, greedy flag and prediction of
#     `jumbo eval --per-item` recomputed from the directory (|diff| <= 1e-3 max(1, |x|));
#   - both comparisons would catch c_attn read in jumbo's per-head q|k|v order;
#   - `jumbo generate`'s greedy tokens (the KV-cache decoder) equal the argmax of the
#     directory's full forward after the same prefix (tokens only: a gross decoding error
#     shows, a small shift of the log-probabilities may not; those are compared with the
#     training forward in tests/infer/mpi/test_decode.cpp);
#   - user mistakes: exit 2 with one line naming the flag or file.
# A tp 2 x pp 2 run, so c_attn is put together from two tp rectangles before its columns are
# regrouped. Usage: hf_gpt2_export.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
py=/usr/bin/python3  # Debian's, with torch (python3 on PATH may be a pyenv without it)
gpt2=tests/infer/torch_gpt2.py

# 400 steps at a high learning rate: enough training that attention matters, so a wrong q/k/v
# order would move every log-likelihood far beyond the tolerance (the script checks this).
steps=400
train_small "$jumbo" 4 "$tmp" --set model.vocab=500 --set parallel.tp=2 --set parallel.pp=2 \
  --set train.global_batch=8 --set train.steps=$steps --set train.lr=3e-3 \
  --set train.warmup_tokens=0 --set train.eval_every=$steps --set "data.valid=$tmp/data" \
  --set "log.metrics_file=$tmp/metrics.jsonl" --set log.every=100 \
  --set checkpoint.every=$steps --set "checkpoint.dir=$tmp/ck" >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "training run"; finish; }
tail -3 "$tmp/train.log"

source tests/support/expect_error.sh

# ---- user mistakes ------------------------------------------------------------------------
expect_error bad_format "--format gpt3: the only format is safetensors, hf, peft or hf-gpt2$" \
  "$jumbo" ckpt export "$tmp/ck" --format gpt3 -o "$tmp/x"
expect_error bad_dtype "--dtype f16: expected f32 or bf16$" \
  "$jumbo" ckpt export "$tmp/ck" --format hf-gpt2 -o "$tmp/x" --dtype f16
expect_error tokenizer_flag "--tokenizer: only with --format hf-gpt2" \
  "$jumbo" ckpt export "$tmp/ck" --format safetensors -o "$tmp/x" --tokenizer "$tmp/tok.model"
expect_error no_tokenizer "$tmp/none.model: no such tokenizer file \(named by --tokenizer\); pass --tokenizer PATH" \
  "$jumbo" ckpt export "$tmp/ck" --format hf-gpt2 -o "$tmp/x" --tokenizer "$tmp/none.model"
touch "$tmp/a_file"
expect_error out_is_file "-o $tmp/a_file: exists and is not a directory" \
  "$jumbo" ckpt export "$tmp/ck" --format hf-gpt2 -o "$tmp/a_file"
# The run's tokenizer gone (the checkpoint names a path): one line naming it and the flag;
# --tokenizer then supplies it.
cp -r "$tmp/ck" "$tmp/moved"
"$py" - "$tmp/moved/step_$(printf %08d $steps)/manifest.json" "$tmp/gone/tok.model" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["data"]["tokenizer"] = sys.argv[2]
json.dump(m, open(sys.argv[1], "w"), indent=1, sort_keys=True)
EOF
expect_error moved_tokenizer "$tmp/gone/tok.model: no such tokenizer file \(named by the checkpoint's data.tokenizer\); pass --tokenizer PATH" \
  "$jumbo" ckpt export "$tmp/moved" --format hf-gpt2 -o "$tmp/x"
[[ -e $tmp/x ]] && fail "a refused export created its directory"
"$jumbo" ckpt export "$tmp/moved" --format hf-gpt2 -o "$tmp/moved_hf" --tokenizer "$tmp/tok.model" \
  >/dev/null || fail "export with --tokenizer over a moved tokenizer"
cmp -s "$tmp/tok.model" "$tmp/moved_hf/tokenizer.model" || fail "--tokenizer: not the file copied"
# A corrupt shard: named, and nothing left behind (the directory was made by this export).
step_dir=step_$(printf %08d $steps)
cp -r "$tmp/ck" "$tmp/bad"
"$py" -c "f=open('$tmp/bad/$step_dir/tp1-pp1-dp0.h5','r+b'); f.seek(5000); b=f.read(1); \
f.seek(5000); f.write(bytes([b[0]^1]))"
expect_error corrupt "tp1-pp1-dp0.h5: CRC-32 [0-9a-f]+, the manifest says" \
  "$jumbo" ckpt export "$tmp/bad" --format hf-gpt2 -o "$tmp/bad_hf"
[[ -e $tmp/bad_hf ]] && fail "a failed export left $tmp/bad_hf behind"

# ---- the export, read by GPT-2's conventions ----------------------------------------------
"$jumbo" ckpt export "$tmp/ck" --format hf-gpt2 -o "$tmp/hf" || fail "export f32"
"$jumbo" ckpt export "$tmp/ck/$step_dir" --format hf-gpt2 -o "$tmp/hf_bf16" --dtype bf16 ||
  fail "export bf16"
layout() {
  "$py" "$gpt2" layout "$@" --vocab 500 --eos 2 --layers 2 --d-model 64 --heads 4 --ffn 256 \
    --context 32 --tokenizer "$tmp/tok.model" --eos-piece '</s>' --unk-piece '<unk>'
}
layout "$tmp/hf" || fail "layout of the f32 export"
layout "$tmp/hf_bf16" --dtype bf16 || fail "layout of the bf16 export"
"$py" "$gpt2" bf16 "$tmp/hf" "$tmp/hf_bf16" || fail "bf16 rounding"
# The same weights as dp 2 ZeRO-1 shards in 1000-element buckets: pieces cut into element
# ranges that start and end inside rows, each placed through the transposes and the regrouping.
"$jumbo" ckpt convert "$tmp/ck" -o "$tmp/z1" --dp 2 --zero1 --bucket-size 1000 >/dev/null ||
  fail "convert to ZeRO-1"
"$jumbo" ckpt export "$tmp/z1" --format hf-gpt2 -o "$tmp/hf_z1" >/dev/null || fail "export z1"
"$py" "$gpt2" same "$tmp/hf" "$tmp/hf_z1" || fail "the ZeRO-1 layout exports other values"

# The trainer evaluated the checkpoint's weights (eval after the last step's update, then the
# save): train.eval_batches (8) windows of one microbatch, in stored order, dp 1.
val_loss=$("$py" -c "import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(repr([r for r in rows if r['step'] == $steps][0]['val_loss']))" "$tmp/metrics.jsonl") ||
  fail "no val_loss at step $steps"
"$py" "$gpt2" loss "$tmp/hf" --bin "$tmp/data.part-000000.bin" --windows 8 --expect "$val_loss" ||
  fail "loss of the exported model against jumbo's val_loss"

# ---- against jumbo eval -------------------------------------------------------------------
# Short items: context, EOS and continuation fit the tiny model's 32 positions.
cat >"$tmp/task.jsonl" <<'EOF'
{"context": "The jury said it", "continuations": [" did", " was", " the city"], "answer": 0}
{"context": "He said that the", "continuations": [" man", " of the", " was"], "answer": 0}
{"context": "In the first place,", "continuations": [" he", " the", " it was"], "answer": 1}
{"context": "It was a very", "continuations": [" good", " long time", " the"], "answer": 0}
{"context": "The United States", "continuations": [" government", " is", " of"], "answer": 0}
{"context": "She looked at him and", "continuations": [" said", " smiled", " the"], "answer": 0}
EOF
if "$jumbo" eval --checkpoint "$tmp/ck" --task "$tmp/task.jsonl" --per-item "$tmp/items.jsonl" \
  >"$tmp/eval.log" 2>&1; then
  tail -2 "$tmp/eval.log"
  "$py" "$gpt2" per-item "$tmp/hf" --per-item "$tmp/items.jsonl" --items 6 ||
    fail "jumbo eval's log-likelihoods against the exported directory"
  # Cached decoding: generate's greedy tokens after each item's context, against the argmax
  # of the directory's full forward (the prompt tokens are eval's context tokens: both are
  # EOS + the encoded text).
  "$py" -c 'import json, sys
for l in open(sys.argv[1]):
    print(json.dumps({"prompt": json.loads(l)["context"]}))' "$tmp/task.jsonl" >"$tmp/prompts.jsonl"
  if "$jumbo" generate --checkpoint "$tmp/ck" --prompts "$tmp/prompts.jsonl" --max-new-tokens 8 \
    --json >"$tmp/generated.jsonl" 2>"$tmp/generate.log"; then
    "$py" "$gpt2" greedy "$tmp/hf" --per-item "$tmp/items.jsonl" --generated "$tmp/generated.jsonl" ||
      fail "jumbo generate's greedy tokens against the exported directory's full forward"
  else
    cat "$tmp/generate.log"
    fail "jumbo generate failed (the decoding comparison)"
  fi
else
  cat "$tmp/eval.log"
  fail "jumbo eval --task --per-item failed (the comparison target)"
fi

finish "all checks passed"
