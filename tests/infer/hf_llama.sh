#!/usr/bin/env bash
# `jumbo ckpt import --format hf` and `ckpt export --format hf` for the Llama family, against
# directories written without jumbo (tests/infer/hf_llama_dirs.py: transformers' names, shapes,
# config.json keys and save_pretrained's sharding) and a float64 reader of them:
#   - Llama (GQA, untied, rope_scaling llama3, BF16, three shards and an index): the import
#     lists the config keys it ignores; `ckpt inspect --verify` passes; `jumbo eval --per-item`
#     (1 rank, and tp 2 x pp 2) gives the reader's log-likelihoods within 1e-4, and `jumbo
#     generate`'s greedy tokens are the reader's argmax; export --dtype bf16 then holds the
#     same bytes tensor for tensor, sharded by --max-shard-size as save_pretrained shards;
#   - Qwen2 (tied, q/k/v biases, F32) and Mistral (F16): the reader's log-likelihoods; Qwen2's
#     f32 export byte for byte;
#   - refusals, one line each, exit 2, nothing at -o: a shard the index names is missing, a
#     tensor of the wrong shape, rope_scaling yarn, a sliding window, MoE fields, an unknown
#     architecture, biases on attention alone, a tokenizer.json of WordPiece or Unigram, a
#     non-empty -o; an export of GPT's block as hf.
# Usage: hf_llama.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
source tests/support/expect_error.sh
export OMP_NUM_THREADS=1
py=/usr/bin/python3
dirs=tests/infer/hf_llama_dirs.py
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
cp "$tmp/tok.model" "$tmp/tokenizer.model"  # vocab 500: every row of the models below a piece

printf '%s\n' \
  '{"context": "The jury said it did find that the", "continuations": [" election was", " city"], "answer": 0}' \
  '{"context": "In the morning", "continuations": [" he went home", " of"], "answer": 0}' \
  '{"context": "A", "continuations": [" report on the state of the", " b"], "answer": 0}' >"$tmp/task.jsonl"
"$py" -c 'import json, sys
for line in open(sys.argv[1]): print(json.dumps({"prompt": json.loads(line)["context"]}))' \
  "$tmp/task.jsonl" >"$tmp/prompts.jsonl"

scored() {  # scored NAME HF_DIR CKPT [EVAL FLAGS...]: eval --per-item against the reader
  local name=$1 hf=$2 ck=$3
  shift 3
  ${launch:-} "$jumbo" eval --checkpoint "$ck" --task "$tmp/task.jsonl" --per-item "$tmp/$name.items" "$@" \
    >"$tmp/$name.eval" 2>&1 || { cat "$tmp/$name.eval"; fail "$name: eval"; return 0; }
  "$py" "$dirs" per-item "$hf" --per-item "$tmp/$name.items" || fail "$name: log-likelihoods"
}
greedy() {  # greedy NAME HF_DIR CKPT
  "$jumbo" generate --checkpoint "$3" --prompts "$tmp/prompts.jsonl" --max-new-tokens 8 \
    --temperature 0 --json >"$tmp/$1.gen" || { fail "$1: generate"; return 0; }
  "$py" "$dirs" greedy "$2" --per-item "$tmp/$1.items" --generated "$tmp/$1.gen" ||
    fail "$1: greedy tokens"
}

# ---- Llama: GQA, untied, llama3 RoPE scaling, BF16 in three shards -------------------------
"$py" "$dirs" write "$tmp/llama" --arch llama --llama3-scaling --std 0.2 --shards 3 \
  --tokenizer "$tmp/tokenizer.model" || fail "writing the Llama directory"
"$jumbo" ckpt import --format hf "$tmp/llama" -o "$tmp/llama_ck" >"$tmp/import.txt" ||
  { cat "$tmp/import.txt"; fail "import"; finish; }
cat "$tmp/import.txt"
grep -q "^$tmp/llama/config.json: ignored (they do not change the computation): bos_token_id, eos_token_id, initializer_range, pretraining_tp, transformers_version, use_cache$" "$tmp/import.txt" ||
  fail "the import does not list the ignored config keys"
grep -q "LlamaForCausalLM of 2 layers, d_model 64, 4 heads (2 kv), ffn 160, vocab 500 (padded 512), context 64 (21 tensors from 3 files" "$tmp/import.txt" ||
  fail "the import's summary"
"$jumbo" ckpt inspect "$tmp/llama_ck" --verify >"$tmp/inspect.txt" ||
  { cat "$tmp/inspect.txt"; fail "ckpt inspect --verify of the imported checkpoint"; }
scored llama "$tmp/llama" "$tmp/llama_ck"
greedy llama "$tmp/llama" "$tmp/llama_ck"
launch="mpirun -np 4 --oversubscribe" scored llama_tp2pp2 "$tmp/llama" "$tmp/llama_ck" --tp 2 --pp 2
grep -q '"layout":"tp2-pp2-dp1"' "$tmp/llama_tp2pp2.eval" || fail "the tp 2 x pp 2 eval ran another layout"

"$jumbo" ckpt export "$tmp/llama_ck" --format hf --dtype bf16 --max-shard-size 60KB \
  -o "$tmp/llama_out" >"$tmp/export.txt" || { cat "$tmp/export.txt"; fail "export"; }
cat "$tmp/export.txt"
"$py" "$dirs" same "$tmp/llama" "$tmp/llama_out" || fail "import then export changed a tensor"
"$py" - "$tmp/llama_out" 60000 <<'PY' || fail "the export's shards are not save_pretrained's"
import json, os, struct, sys
d, limit = sys.argv[1], int(sys.argv[2])
index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
files = sorted(set(index["weight_map"].values()))
n = len(files)
assert files == [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)], files
total = 0
for f in files:
    with open(os.path.join(d, f), "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    sizes = [e["data_offsets"][1] - e["data_offsets"][0] for k, e in h.items() if k != "__metadata__"]
    total += sum(sizes)
    assert sum(sizes) <= limit or len(sizes) == 1, (f, sizes)
assert total == index["metadata"]["total_size"], (total, index["metadata"])
cfg = json.load(open(os.path.join(d, "config.json")))
assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 2, cfg
assert cfg["rope_scaling"]["rope_type"] == "llama3" and cfg["torch_dtype"] == "bfloat16", cfg
for name in ("tokenizer.model", "generation_config.json", "tokenizer_config.json"):
    assert os.path.exists(os.path.join(d, name)), name
print(f"export: {n} shards of at most {limit} bytes, total_size {total}, config.json as transformers'")
PY

# ---- Qwen2 (tied, q/k/v biases, F32) and Mistral (F16) -------------------------------------
"$py" "$dirs" write "$tmp/qwen" --arch qwen2 --tied --dtype F32 --std 0.2 --kv-heads 1 \
  --tokenizer "$tmp/tokenizer.model" || fail "writing the Qwen2 directory"
"$jumbo" ckpt import --format hf "$tmp/qwen" -o "$tmp/qwen_ck" >/dev/null || fail "Qwen2 import"
scored qwen "$tmp/qwen" "$tmp/qwen_ck"
"$jumbo" ckpt export "$tmp/qwen_ck" --format hf -o "$tmp/qwen_out" >/dev/null &&
  "$py" "$dirs" same "$tmp/qwen" "$tmp/qwen_out" || fail "Qwen2: import then export"
"$py" -c 'import json, sys; c = json.load(open(sys.argv[1])); assert c["architectures"] == ["Qwen2ForCausalLM"] and c["tie_word_embeddings"], c' \
  "$tmp/qwen_out/config.json" || fail "Qwen2's exported config.json"
"$py" "$dirs" write "$tmp/mistral" --arch mistral --dtype F16 --std 0.2 --kv-heads 4 --shards 2 \
  --tokenizer "$tmp/tokenizer.model" || fail "writing the Mistral directory"
"$jumbo" ckpt import --format hf "$tmp/mistral" -o "$tmp/mistral_ck" >/dev/null || fail "Mistral import"
scored mistral "$tmp/mistral" "$tmp/mistral_ck"

# ---- user mistakes: one line, exit 2, nothing at -o ----------------------------------------
broken() {  # broken NAME DEFECT: a copy of the Llama directory with one defect
  rm -rf "$tmp/$1" && cp -r "$tmp/llama" "$tmp/$1" && "$py" "$dirs" break "$tmp/$1" "$2"
}
refused() {  # refused NAME REGEX DIR
  expect_error "$1" "$2" "$jumbo" ckpt import --format hf "$3" -o "$tmp/out_$1"
  [[ -e $tmp/out_$1 ]] && fail "$1: a refused import wrote $tmp/out_$1"
  return 0
}
broken no_shard drop-file
refused missing_shard "^jumbo: error: $tmp/no_shard/model-00003-of-00003.safetensors: no such file, named by $tmp/no_shard/model.safetensors.index.json for tensor " "$tmp/no_shard"
broken shape wrong-shape
refused wrong_shape "^jumbo: error: $tmp/shape/model-00003-of-00003.safetensors: tensor model.norm.weight is \[65\]; config.json's model needs \[64\]$" "$tmp/shape"
broken yarn 'config rope_scaling={"rope_type": "yarn", "factor": 4.0}'
refused yarn "^jumbo: error: $tmp/yarn/config.json: rope_scaling.rope_type = \"yarn\": jumbo implements RoPE scaling \"llama3\" only" "$tmp/yarn"
broken window 'config sliding_window=16'
refused sliding_window "^jumbo: error: $tmp/window/config.json: sliding_window = 16: sliding-window attention is not implemented in jumbo" "$tmp/window"
broken moe 'config num_local_experts=8'
refused moe "^jumbo: error: $tmp/moe/config.json: num_local_experts = 8: mixture-of-experts fields are not implemented in jumbo$" "$tmp/moe"
broken arch 'config architectures=["GemmaForCausalLM"]'
refused architecture "^jumbo: error: $tmp/arch/config.json: architectures = \[\"GemmaForCausalLM\"\]: expected LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM$" "$tmp/arch"
broken bias 'config attention_bias=true'
refused attention_bias "^jumbo: error: $tmp/bias/config.json: attention_bias = true: jumbo puts biases on every linear map or none" "$tmp/bias"
# A tokenizer.json of a model type jumbo does not implement (WordPiece; Unigram in JSON).
for type in WordPiece Unigram; do
  rm -rf "$tmp/tok_$type" && cp -r "$tmp/llama" "$tmp/tok_$type" && rm "$tmp/tok_$type/tokenizer.model"
  printf '{"version": "1.0", "model": {"type": "%s", "vocab": {}}}\n' "$type" >"$tmp/tok_$type/tokenizer.json"
  refused "tokenizer_$type" "^jumbo: error: $tmp/tok_$type/tokenizer.json: model.type = \"$type\": jumbo reads byte-level BPE" "$tmp/tok_$type"
done
mkdir -p "$tmp/full" && touch "$tmp/full/other"
expect_error out_not_empty "-o $tmp/full: is not empty; expected a new \(or empty\) checkpoint root" \
  "$jumbo" ckpt import --format hf "$tmp/llama" -o "$tmp/full"
[[ $(ls "$tmp/full") == other ]] || fail "out_not_empty: the refused import changed $tmp/full"
expect_error export_gpt "^jumbo: error: .*: --format hf writes the Llama family \(rmsnorm, rope, swiglu, no qk-norm\); this model has norm layernorm" \
  bash -c "source tests/support/small_run.sh; train_small '$jumbo' 1 '$tmp' --set model.vocab=500 --set train.steps=1 --set train.global_batch=1 --set checkpoint.every=1 --set checkpoint.dir='$tmp/gpt_ck' >/dev/null 2>&1; '$jumbo' ckpt export '$tmp/gpt_ck' --format hf -o '$tmp/gpt_out'"
[[ -e $tmp/gpt_out ]] && fail "export_gpt: a refused export wrote $tmp/gpt_out"

cat "$tmp/llama_tp2pp2.eval" | tail -3
finish "all checks passed"
