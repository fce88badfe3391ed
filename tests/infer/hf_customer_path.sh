#!/usr/bin/env bash
# The customer's path, end to end, from a Hugging Face directory to a Hugging Face directory:
#   1. a Llama 3-style model written without jumbo (tests/infer/hf_llama_dirs.py: GQA, untied,
#      random weights) with a byte-level BPE tokenizer.json (tests/data/hf_tokenizer_write.py:
#      Llama 3's split regex and special tokens) and Llama 3.1's own Jinja chat template in its
#      tokenizer_config.json (tests/data/chat_templates/);
#   2. `jumbo ckpt import --format hf`: the checkpoint, model.toml, the tokenizer files and the
#      chat template recorded;
#   3. `data prepare --chat-template ROOT/tokenizer_config.json` on {"messages": [...]}
#      conversations, and two LoRA fine-tunes from the imported checkpoint: "paris" (PEFT's
#      seven maps, 1 rank) and "rome" (the fused q/k/v map, on tp 2 x pp 2);
#   4. both adapters served over the base, by one rank and by tp 2 x pp 2, chatting through the
#      official `openai` npm client: each replies what it learned, stopping at <|eot_id|>; a
#      template's raise_exception is a 400 with its message, and the server stays up;
#   5. `ckpt merge`, then `ckpt export --format hf`: the same bytes as exporting the LoRA
#      checkpoint directly (merged while exported); `--format peft`: PEFT's reading of the
#      adapter applied to the base is the merged model (the fused qkv split into q/k/v);
#   6. the independent float64 reader of the exported directory computes the same next-token
#      log-likelihoods as `jumbo eval --adapter` (1 rank and tp 2 x pp 2) within 1e-4, and
#      `jumbo generate --adapter`'s greedy tokens are its argmax.
# Usage: hf_customer_path.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/serve_harness.sh
server_pid=
on_exit stop_server_now
export OMP_NUM_THREADS=1
py=/usr/bin/python3
dirs=tests/infer/hf_llama_dirs.py
npm_prefix=${JUMBO_NPM_PREFIX:-$HOME/.cache/jumbo/npm}
[[ -f $npm_prefix/node_modules/openai/package.json ]] ||
  { fail "the openai npm package is not in $npm_prefix (run scripts/install-deps.sh)"; finish; }

# ---- 1. the Hugging Face directory ---------------------------------------------------------
python3 tests/data/hf_tokenizer_write.py "$repo" "$tmp/tok" >/dev/null || { fail "tokenizer"; finish; }
mkdir -p "$tmp/tokfiles" && cp "$tmp/tok/llama3/tokenizer.json" "$tmp/tokfiles/"
vocab=$(python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
cfg = json.load(open(f"{tmp}/tok/llama3/tokenizer_config.json"))
cfg["chat_template"] = json.load(open("tests/data/chat_templates/Llama-3.1-8B-Instruct/tokenizer_config.json"))["chat_template"]
json.dump(cfg, open(f"{tmp}/tokfiles/tokenizer_config.json", "w"), indent=2)
t = json.load(open(f"{tmp}/tokfiles/tokenizer.json"))
# Llama 3's own post_processor: ByteLevel, then <|begin_of_text|> before every text.
bos = next(a["id"] for a in t["added_tokens"] if a["content"] == "<|begin_of_text|>")
t["post_processor"] = {"type": "Sequence", "processors": [
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
    {"type": "TemplateProcessing",
     "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
     "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
              {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
     "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos], "tokens": ["<|begin_of_text|>"]}}}]}
json.dump(t, open(f"{tmp}/tokfiles/tokenizer.json", "w"), ensure_ascii=False)
print(max(max(t["model"]["vocab"].values()), max(a["id"] for a in t["added_tokens"])) + 1)
PY
) || { fail "tokenizer_config.json"; finish; }
"$py" "$dirs" write "$tmp/hf" --arch llama --vocab "$vocab" --context 256 --layers 2 --d-model 64 \
  --heads 4 --kv-heads 2 --ffn 160 --std 0.2 \
  --tokenizer "$tmp/tokfiles/tokenizer.json" "$tmp/tokfiles/tokenizer_config.json" ||
  { fail "writing the directory"; finish; }

# ---- 2. import -------------------------------------------------------------------------------
"$jumbo" ckpt import --format hf "$tmp/hf" -o "$tmp/base" >"$tmp/import.txt" ||
  { cat "$tmp/import.txt"; fail "import"; finish; }
tail -1 "$tmp/import.txt"
grep -q "tokenizer.json, tokenizer_config.json, model.toml; its chat template recorded" "$tmp/import.txt" ||
  fail "the import does not name the tokenizer files, model.toml and the chat template"
base_model=hf@step_00000000

# ---- 3. conversations, two LoRA fine-tunes -------------------------------------------------
python3 - "$tmp" <<'PY'
import json, random, sys
tmp = sys.argv[1]
rng = random.Random(5)
countries = ["France", "Spain", "Peru", "Japan", "Kenya", "Chile", "Norway", "Egypt"]
asks = ["What is the capital of {}?", "Name the capital of {}.", "Which city is the capital of {}?",
        "Tell me the capital city of {}."]
for name, answer in (("paris", "Paris."), ("rome", "Rome.")):
    with open(f"{tmp}/chats_{name}.jsonl", "w") as f:
        for i in range(48):
            msgs = [{"role": "system", "content": "You answer in one word."}] if i % 3 == 0 else []
            if i % 4 == 1:
                msgs += [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."}]
            msgs += [{"role": "user", "content": rng.choice(asks).format(rng.choice(countries))},
                     {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": msgs}) + "\n")
PY
for n in paris rome; do
  "$jumbo" data prepare --format prompt-completion --chat-template "$tmp/base/tokenizer_config.json" \
    --tokenizer "$tmp/base/tokenizer.json" -i "$tmp/chats_$n.jsonl" -o "$tmp/data_$n" \
    --progress-every 0 >/dev/null || fail "data prepare $n"
done
finetune() {  # finetune NAME NP TARGETS [--set ...]
  local name=$1 np=$2 targets=$3
  shift 3
  mpirun -np "$np" --oversubscribe "$jumbo" train --set "model.preset=$tmp/base/model.toml" \
    --set "train.init_from=$tmp/base" --set finetune.method=lora --set finetune.lora_rank=8 \
    --set finetune.lora_alpha=16 --set "finetune.lora_targets=$targets" \
    --set "data.train=$tmp/data_$name" --set data.valid= --set "data.tokenizer=$tmp/base/tokenizer.json" \
    --set "data.chat_template=$tmp/base/tokenizer_config.json" --set train.steps=60 \
    --set train.global_batch=8 --set train.lr=1e-2 --set train.warmup_tokens=0 \
    --set train.eval_every=0 --set checkpoint.every=60 --set "checkpoint.dir=$tmp/lora_$name" \
    --set log.metrics_file= --set log.peak_tflops=1 --set log.every=60 "$@" >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log"; fail "fine-tune $name"; return 1; }
  grep '^done' "$tmp/$name.log"
}
finetune paris 1 all --set parallel.micro_batch=8 || finish
finetune rome 4 qkv,proj,gate,up,fc2 --set parallel.tp=2 --set parallel.pp=2 \
  --set parallel.micro_batch=2 || finish

# ---- 4. served, chatting through the openai client ------------------------------------------
chat() {  # chat NAME RANKS [SERVE FLAGS...]: serve both adapters, run the client
  local name=$1 np=$2
  shift 2
  start_server "$name" mpirun -np "$np" --oversubscribe "$jumbo" serve --checkpoint "$tmp/base" \
    --port 0 --adapter "paris=$tmp/lora_paris" --adapter "rome=$tmp/lora_rome" "$@" || return 0
  grep -q "chat template step_00000000 (data.chat_template)" "$tmp/$name.out" ||
    fail "$name: the server does not take the imported chat template: $(head -1 "$tmp/$name.out")"
  JUMBO_NPM_PREFIX=$npm_prefix node tests/infer/hf_customer_chat.mjs "$port" "$base_model" ||
    fail "$name: chat through the openai client"
  stop_server "$name" USR1  # mpirun forwards SIGUSR1 to the ranks (serve_harness.sh)
}
chat serve1 1
chat serve_tp2pp2 4 --tp 2 --pp 2
# raise_exception: Mistral's template refuses roles that do not alternate: 400, the server stays.
if start_server mistral "$jumbo" serve --checkpoint "$tmp/base" --port 0 \
  --chat-template tests/data/chat_templates/Mistral-7B-Instruct-v0.3/tokenizer_config.json; then
  body='{"model": "'$base_model'", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "max_tokens": 2}'
  out=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$body")
  echo "raise_exception: $out"
  [[ $out == *'"message":"messages: After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."'*' 400' ]] ||
    fail "raise_exception: expected a 400 with the template's message"
  ok='{"model": "'$base_model'", "messages": [{"role": "user", "content": "a"}], "max_tokens": 2}'
  [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$ok") == 200 ]] ||
    fail "after a raise_exception the server does not answer"
  stop_server mistral
fi

# ---- 5. merge, export, PEFT -----------------------------------------------------------------
"$jumbo" ckpt merge --adapter "$tmp/lora_paris" -o "$tmp/merged" >/dev/null || fail "merge"
"$jumbo" ckpt export "$tmp/merged" --format hf -o "$tmp/out_merged" >/dev/null || fail "export of the merged checkpoint"
for n in paris rome; do
  "$jumbo" ckpt export "$tmp/lora_$n" --format hf -o "$tmp/out_$n" | tail -1 || fail "export of $n"
  "$jumbo" ckpt export "$tmp/lora_$n" --format peft -o "$tmp/peft_$n" | tail -1 || fail "PEFT export of $n"
  "$py" "$dirs" peft "$tmp/hf" "$tmp/peft_$n" "$tmp/out_$n" || fail "PEFT's reading of $n"
done
"$py" "$dirs" same "$tmp/out_merged" "$tmp/out_paris" || fail "merge + export differs from exporting the LoRA checkpoint"
grep -q '"q_proj"' "$tmp/peft_rome/adapter_config.json" || fail "rome's fused qkv is not q_proj, k_proj, v_proj in PEFT"

# ---- 6. the float64 reader of the export against eval and generate --------------------------
"$jumbo" data render-chat --chat-template "$tmp/base/tokenizer_config.json" --add-generation-prompt \
  --input <(head -2 "$tmp/chats_paris.jsonl" | python3 -c 'import json, sys
for l in sys.stdin: m = json.loads(l)["messages"]; print(json.dumps({"messages": m[:-1]}))') >"$tmp/prompts.txt" ||
  fail "render-chat"
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
with open(f"{tmp}/task.jsonl", "w") as task, open(f"{tmp}/prompts.jsonl", "w") as prompts:
    for line in open(f"{tmp}/prompts.txt"):
        text = json.loads(line)["text"]
        task.write(json.dumps({"context": text, "continuations": ["Paris.<|eot_id|>", "Rome.<|eot_id|>"], "answer": 0}) + "\n")
        prompts.write(json.dumps({"prompt": text}) + "\n")
    task.write(json.dumps({"context": "The capital", "continuations": [" of France is Paris", " city"], "answer": 0}) + "\n")
PY
for n in paris rome; do
  "$jumbo" eval --checkpoint "$tmp/base" --adapter "$tmp/lora_$n" --task "$tmp/task.jsonl" \
    --per-item "$tmp/$n.items" >"$tmp/$n.eval" || fail "eval --adapter $n"
  "$py" "$dirs" per-item "$tmp/out_$n" --per-item "$tmp/$n.items" || fail "$n: log-likelihoods"
  mpirun -np 4 --oversubscribe "$jumbo" eval --checkpoint "$tmp/base" --adapter "$tmp/lora_$n" \
    --task "$tmp/task.jsonl" --per-item "$tmp/$n.items4" --tp 2 --pp 2 >"$tmp/$n.eval4" ||
    fail "eval --adapter $n on tp 2 x pp 2"
  "$py" "$dirs" per-item "$tmp/out_$n" --per-item "$tmp/$n.items4" || fail "$n: log-likelihoods on tp 2 x pp 2"
done
"$py" - "$tmp" <<'PY' || fail "the adapters do not prefer their own answers, or a context does not start with one <|begin_of_text|>"
import json, sys
tmp = sys.argv[1]
bos = next(a["id"] for a in json.load(open(f"{tmp}/base/tokenizer.json"))["added_tokens"] if a["content"] == "<|begin_of_text|>")
for line in open(f"{tmp}/paris.items"):  # the chat contexts wrote their BOS; " The capital" gets it
    ctx = json.loads(line)["context_tokens"]
    assert ctx[0] == bos and ctx[1] != bos, ctx[:3]
print("eval: every context starts with one <|begin_of_text|>, as transformers encodes it")
for name, want in (("paris", 0), ("rome", 1)):
    items = [json.loads(l) for l in open(f"{tmp}/{name}.items")][:2]
    assert all(i["predicted"] == want for i in items), (name, [i["predicted"] for i in items])
print("eval: each adapter scores its own answer above the other's after the chat prompt")
PY
"$jumbo" generate --checkpoint "$tmp/base" --adapter "$tmp/lora_rome" --prompts "$tmp/prompts.jsonl" \
  --max-new-tokens 4 --temperature 0 --json >"$tmp/rome.gen" || fail "generate --adapter"
"$py" "$dirs" greedy "$tmp/out_rome" --per-item <(head -2 "$tmp/rome.items") --generated "$tmp/rome.gen" ||
  fail "generate's greedy tokens against the reader"

finish "all checks passed"
