#!/usr/bin/env bash
# `jumbo ckpt import --format hf-gpt2`, the inverse of `ckpt export --format hf-gpt2`:
#   - export (f32) then import is the identity: `ckpt export --format safetensors` of the
#     original (saved by a tp 2 run) and of the imported checkpoint hold the same bytes, and
#     `jumbo eval` gives the same loss on both, to the last digit;
#   - the imported checkpoint is a tp 1 x pp 1 x dp 1 save at step 0 of the original's model,
#     with zero Adam moments, zero padding rows, the tokenizer copied beside it (data.tokenizer),
#     and it passes `ckpt inspect --verify`; a run resumes from it;
#   - a bf16 export imports to its bf16 values exactly (widened, not rounded again);
#   - GPT-2's own layout (openai-community/gpt2): names without "transformer.", attention
#     buffers, a tied lm_head.weight, the hub's config.json, F16 and BF16 tensors, and BPE
#     files (vocab.json, merges.txt) instead of tokenizer.model: refused with one line unless
#     --tokenizer names a SentencePiece model of vocab_size pieces; then the same weights;
#   - user mistakes (a missing config.json or tensor, a wrong shape, an untied head, a config
#     jumbo cannot compute, a non-empty -o, ...): exit 2, one line naming the file and key or
#     tensor, and nothing written at -o.
# Usage: hf_gpt2_import.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
source tests/support/expect_error.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
py=/usr/bin/python3  # Debian's, with numpy and h5py (python3 on PATH may be a pyenv without them)
dirs=tests/infer/hf_gpt2_dirs.py

steps=30
step_dir=step_$(printf %08d $steps)
train_small "$jumbo" 2 "$tmp" --set model.vocab=500 --set parallel.tp=2 \
  --set train.global_batch=4 --set train.steps=$steps --set train.lr=3e-3 \
  --set train.warmup_tokens=0 --set checkpoint.every=$steps --set "checkpoint.dir=$tmp/ck" \
  >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; fail "training run"; finish; }
tail -1 "$tmp/train.log"
check "export f32" "$jumbo" ckpt export "$tmp/ck" --format hf-gpt2 -o "$tmp/hf" >/dev/null || finish

# ---- export, import: the same checkpoint ---------------------------------------------------
"$jumbo" ckpt import --format hf-gpt2 "$tmp/hf" -o "$tmp/imported" || fail "import"
"$py" "$dirs" imported "$tmp/imported" --like "$tmp/ck/$step_dir/manifest.json" \
  --tokenizer "$tmp/tok.model" || fail "the imported checkpoint's manifest and shard"
"$jumbo" ckpt inspect "$tmp/imported" --verify >"$tmp/inspect.txt" ||
  { cat "$tmp/inspect.txt"; fail "ckpt inspect --verify of the imported checkpoint"; }
"$jumbo" ckpt export "$tmp/ck" --format safetensors -o "$tmp/original.safetensors" >/dev/null &&
  "$jumbo" ckpt export "$tmp/imported" --format safetensors -o "$tmp/imported.safetensors" \
    >/dev/null || fail "safetensors exports"
"$py" "$dirs" same-weights "$tmp/original.safetensors" "$tmp/imported.safetensors" ||
  fail "export then import changed the weights"
loss_of() {  # loss_of CHECKPOINT: eval's data.loss over the first 4 windows, as printed
  "$jumbo" eval --checkpoint "$1" --data "$tmp/data" --windows 4 |
    "$py" -c 'import json, sys; print(repr(json.loads(sys.stdin.read().strip().splitlines()[-1])["data"]["loss"]))'
}
original_loss=$(loss_of "$tmp/ck") || fail "eval of the original"
imported_loss=$(loss_of "$tmp/imported") || fail "eval of the imported checkpoint"
echo "eval loss: original $original_loss, imported $imported_loss"
[[ -n $original_loss && $original_loss == "$imported_loss" ]] ||
  fail "eval loss $imported_loss of the imported checkpoint, $original_loss of the original"

# A run resumes from it (checkpoint.resume) and trains on.
train_small "$jumbo" 1 "$tmp" --set model.vocab=500 --set train.global_batch=4 --set train.steps=2 \
  --set "checkpoint.resume=$tmp/imported/step_00000000" >"$tmp/resume.log" 2>&1 &&
  grep -q "checkpoint: resumed from $tmp/imported/step_00000000 (step 0)" "$tmp/resume.log" ||
  { cat "$tmp/resume.log"; fail "training from the imported checkpoint"; }

# bf16: the import holds the bf16 values themselves, so exporting it as bf16 changes nothing.
"$jumbo" ckpt export "$tmp/ck" --format hf-gpt2 -o "$tmp/hf_bf16" --dtype bf16 >/dev/null &&
  "$jumbo" ckpt import --format hf-gpt2 "$tmp/hf_bf16" -o "$tmp/from_bf16" >/dev/null &&
  "$jumbo" ckpt export "$tmp/from_bf16" --format hf-gpt2 -o "$tmp/from_bf16_hf" >/dev/null ||
  fail "bf16 export, import, f32 export"
"$py" "$dirs" same-values "$tmp/hf_bf16" "$tmp/from_bf16_hf" || fail "bf16 import: other values"

# ---- GPT-2's own layout, with BPE files ----------------------------------------------------
"$py" "$dirs" gpt2-style "$tmp/hf" "$tmp/gpt2" || fail "making the GPT-2-style directory"
expect_error bpe_only "^jumbo: error: $tmp/gpt2: GPT-2 BPE vocabulary \(vocab.json, 500 tokens\) and no tokenizer.model; jumbo tokenizes with SentencePiece: pass --tokenizer MODEL \(vocab 500\)$" \
  "$jumbo" ckpt import --format hf-gpt2 "$tmp/gpt2" -o "$tmp/out"
[[ -e $tmp/out ]] && fail "bpe_only: a refused import wrote $tmp/out"
"$jumbo" data tokenizer --input inputs/data/brown-valid.jsonl --output "$tmp/tok400" \
  --vocab-size 400 --input-sentence-size 2000 --threads 1 >/dev/null || fail "a 400-piece tokenizer"
expect_error tokenizer_vocab "--tokenizer $tmp/tok400.model: 400 pieces, but $tmp/gpt2/config.json has vocab_size = 500: expected a SentencePiece model of 500 pieces$" \
  "$jumbo" ckpt import --format hf-gpt2 "$tmp/gpt2" -o "$tmp/out" --tokenizer "$tmp/tok400.model"
[[ -e $tmp/out ]] && fail "tokenizer_vocab: a refused import wrote $tmp/out"
"$jumbo" ckpt import --format hf-gpt2 "$tmp/gpt2" -o "$tmp/from_gpt2" --tokenizer "$tmp/tok.model" ||
  fail "import of the GPT-2-style directory with --tokenizer"
"$jumbo" ckpt export "$tmp/from_gpt2" --format safetensors -o "$tmp/from_gpt2.safetensors" \
  >/dev/null || fail "safetensors export of the GPT-2-style import"
"$py" "$dirs" same-weights "$tmp/original.safetensors" "$tmp/from_gpt2.safetensors" ||
  fail "GPT-2's layout imported to other weights"
"$py" "$dirs" imported "$tmp/from_gpt2" --like "$tmp/ck/$step_dir/manifest.json" \
  --tokenizer "$tmp/tok.model" || fail "the GPT-2-style import's manifest and shard"
# F16 and BF16 tensors (the values made representable first): imported exactly.
"$py" "$dirs" gpt2-style "$tmp/hf" "$tmp/gpt2_mixed" --dtypes mixed >/dev/null &&
  "$jumbo" ckpt import --format hf-gpt2 "$tmp/gpt2_mixed" -o "$tmp/from_mixed" \
    --tokenizer "$tmp/tok.model" >/dev/null &&
  "$jumbo" ckpt export "$tmp/from_mixed" --format hf-gpt2 -o "$tmp/from_mixed_hf" >/dev/null ||
  fail "F16/BF16 import, f32 export"
"$py" "$dirs" same-values "$tmp/gpt2_mixed" "$tmp/from_mixed_hf" || fail "F16/BF16: other values"

# ---- user mistakes: one line, exit 2, nothing at -o ----------------------------------------
broken() {  # broken NAME DEFECT: a copy of the GPT-2-style directory with one defect
  rm -rf "$tmp/$1" && cp -r "$tmp/gpt2" "$tmp/$1" && "$py" "$dirs" break "$tmp/$1" "$2"
}
refused() {  # refused NAME REGEX DIR [FLAGS...]: the import fails and leaves no -o behind
  local name=$1 want=$2 dir=$3
  shift 3
  expect_error "$name" "$want" "$jumbo" ckpt import --format hf-gpt2 "$dir" -o "$tmp/out_$name" \
    --tokenizer "$tmp/tok.model" "$@"
  [[ -e $tmp/out_$name ]] && fail "$name: a refused import wrote $tmp/out_$name"
  return 0
}
mkdir "$tmp/no_config" && cp "$tmp/gpt2/model.safetensors" "$tmp/no_config/"
refused no_config "$tmp/no_config/config.json: no such file" "$tmp/no_config"
refused no_dir "$tmp/nowhere: no such directory" "$tmp/nowhere"
broken drop drop-tensor
refused missing_tensor "$tmp/drop/model.safetensors: no tensor h.1.mlp.c_fc.bias \(nor transformer.h.1.mlp.c_fc.bias\), which jumbo's layers.1.mlp.fc1.bias needs$" "$tmp/drop"
broken shape wrong-shape
refused wrong_shape "$tmp/shape/model.safetensors: tensor h.0.mlp.c_fc.weight is \[256, 64\]; config.json's model needs \[64, 256\]$" "$tmp/shape"
broken untied untied-head
refused untied_head "$tmp/untied/model.safetensors: tensor lm_head.weight differs from wte.weight \(an untied output head\)" "$tmp/untied"
broken extra extra-tensor
refused extra_tensor "$tmp/extra/model.safetensors: tensor h.9.ln_1.weight has no place in jumbo's GPT-2 of config.json" "$tmp/extra"
broken relu 'config activation_function="relu"'
refused activation "$tmp/relu/config.json: activation_function = \"relu\": expected \"gelu_new\" \(jumbo's MLP uses GELU's tanh approximation\)$" "$tmp/relu"
broken inverse 'config scale_attn_by_inverse_layer_idx=true'
refused inverse_layer_idx "$tmp/inverse/config.json: scale_attn_by_inverse_layer_idx = true: expected false \(jumbo does not scale attention by the layer index" "$tmp/inverse"
broken untie 'config tie_word_embeddings=false'
refused tie_word_embeddings "$tmp/untie/config.json: tie_word_embeddings = false: expected true \(jumbo's output head is wte, tied" "$tmp/untie"
broken eps 'config layer_norm_epsilon=1e-6'
refused epsilon "$tmp/eps/config.json: layer_norm_epsilon = 1e-06: expected 1e-05 \(jumbo's LayerNorm epsilon is fixed\)$" "$tmp/eps"
broken heads 'config n_head=5'
refused heads "$tmp/heads/config.json: n_head = 5 does not divide n_embd = 64$" "$tmp/heads"
broken no_embd 'config n_embd=null'
refused n_embd "$tmp/no_embd/config.json: n_embd = null: expected a positive integer" "$tmp/no_embd"
expect_error bad_format "jumbo ckpt import: --format safetensors: expected hf or hf-gpt2$" \
  "$jumbo" ckpt import --format safetensors "$tmp/gpt2" -o "$tmp/out"
mkdir -p "$tmp/full" && touch "$tmp/full/other"
expect_error out_not_empty "-o $tmp/full: is not empty; expected a new \(or empty\) checkpoint root" \
  "$jumbo" ckpt import --format hf-gpt2 "$tmp/hf" -o "$tmp/full"
[[ $(ls "$tmp/full") == other ]] || fail "out_not_empty: the refused import changed $tmp/full"

finish "all checks passed"
