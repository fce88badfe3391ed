#!/usr/bin/env bash
# Fine-tuning from a trained checkpoint on prompt-completion examples (docs/finetune.md):
#   - the first step's loss equals the base model's masked loss on that batch, recomputed
#     from the files by an independent float64 GPT-2 (tests/infer/torch_gpt2.py examples: the
#     loss over completions and EOS only), which differs from the loss over every token;
#   - packed (several examples per sample) equals padded (one per sample): the same loss and
#     the same weights after the step, within 1e-6;
#   - tp 2 x pp 2 x dp 2 with ZeRO-1 (each rank loading its own slice of the base) equals one
#     rank within 1e-5 over three steps;
#   - a resumed fine-tune is bit-identical to the unbroken one, and every manifest records
#     where its weights came from (train.init_from's step and fingerprint);
#   - LoRA (rank 4 on every map): the first step is the base's exactly (B starts at zero); tp 2
#     x pp 2 x dp 2 with ZeRO-1 and sequence parallelism equals one rank within 1e-5; a resume
#     is bit-identical; the checkpoint holds the adapters alone; merged into the base it gives
#     the LoRA run's validation loss within 1e-5, and so does `eval --adapter` (unmerged, one
#     rank and tp 2 x pp 2);
#   - LoRA dropout: it moves the second step (the first is the base's), a resume is bit-identical, evaluation drops
#     nothing (the run's val_loss = eval --adapter of its checkpoint);
#   - user mistakes: a model of another shape, prompt-completion lines without a completion,
#     a text file as prompt-completion input: exit 2, one line.
# Usage: finetune.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
source tests/support/expect_error.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
py=/usr/bin/python3  # Debian's, with torch and numpy
export OMPI_MCA_rmaps_base_oversubscribe=1

# The base: the tiny model with a 128-token context, trained until the completions are far
# from uniform (so a wrong mask moves the loss well beyond the tolerance).
ctx=(--set model.context=128 --set model.vocab=500)
train_small "$jumbo" 1 "$tmp" "${ctx[@]}" --set train.steps=150 --set train.global_batch=8 \
  --set train.lr=3e-3 --set train.warmup_tokens=0 --set checkpoint.every=150 \
  --set "checkpoint.dir=$tmp/base" >"$tmp/base.log" 2>&1 ||
  { cat "$tmp/base.log"; fail "base training run"; finish; }
tail -1 "$tmp/base.log"

# Examples from the Brown validation split: six words of a document and "Genre:", the genre.
$py - "$tmp/sft.jsonl" <<'EOF'
import json, sys
genres = {"ca": "press reportage", "cb": "press editorial", "cc": "press reviews",
          "cd": "religion", "ce": "skills and hobbies", "cf": "popular lore",
          "cg": "belles lettres", "ch": "government", "cj": "learned", "ck": "fiction",
          "cl": "mystery", "cm": "science fiction", "cn": "adventure", "cp": "romance",
          "cr": "humor"}
with open(sys.argv[1], "w") as out:
    for line in open("inputs/data/brown-valid.jsonl"):
        d = json.loads(line)
        words = d["text"].split()
        for k in (0, 40):
            prompt = " ".join(words[k:k + 6]) + "\nGenre:"
            out.write(json.dumps({"prompt": prompt, "completion": " " + genres[d["id"][:2]]}) + "\n")
EOF
check "prepare prompt-completion" "$jumbo" data prepare --format prompt-completion \
  --input "$tmp/sft.jsonl" --tokenizer "$tmp/tok.model" --output "$tmp/sft" \
  --progress-every 0 >/dev/null || finish
examples=$(wc -l <"$tmp/sft.jsonl")

# One fine-tuning step at a constant learning rate, on the SFT data; later --set win.
finetune() {
  local np=$1 name=$2
  shift 2
  train_small "$jumbo" "$np" "$tmp" "${ctx[@]}" --set "data.train=$tmp/sft" \
    --set "train.init_from=$tmp/base" --set train.lr=1e-3 --set train.min_lr=1e-3 \
    --set train.warmup_tokens=0 --set "log.metrics_file=$tmp/$name.jsonl" \
    --set "checkpoint.dir=$tmp/$name" "$@" >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log"; fail "fine-tune $name"; return 1; }
}
first_loss() { losses "$1" | head -1 | cut -d' ' -f2; }

# ---- the first step's loss is the base's masked loss ----------------------------------------
# Padded: one example per sample, so a batch of all of them is the whole dataset.
# Adam's eps 1e-6 here and in the packed run below, which is compared with this one after a
# step: Adam's first step moves an element by lr g / (|g| + eps), so with the default 1e-8 a
# gradient that is rounding noise, summed in another order (the key biases', zero in exact
# arithmetic: softmax ignores a shift common to a query's scores; a rare token's, cancelling)
# moved by up to lr. A 2-core AMD EPYC's OpenBLAS kernels put the two runs' key biases 3e-5
# apart and nothing else beyond 1.1e-6. Every other element still moves by about lr either way.
quiet_adam=(--set train.eps=1e-6)
finetune 1 padded --set data.packing=false --set train.global_batch="$examples" \
  --set train.steps=1 --set checkpoint.every=1 "${quiet_adam[@]}" || finish
grep -q "init_from: the weights of .*base/step_00000150 (step 150, fingerprint 0x" "$tmp/padded.log" ||
  fail "the run does not say where its weights came from"
check "export the base" "$jumbo" ckpt export --format hf-gpt2 "$tmp/base" -o "$tmp/base-hf" >/dev/null
check "the first step's loss is the base model's masked loss" \
  $py tests/infer/torch_gpt2.py examples "$tmp/base-hf" --parts "$tmp/sft.parts" \
  --expect "$(first_loss "$tmp/padded.jsonl")"
manifest=$tmp/padded/step_00000001/manifest.json
$py - "$manifest" "$tmp/base/step_00000150/manifest.json" <<'EOF' || fail "the manifest's init_from"
import json, sys
m, base = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
i = m["init_from"]
assert i["from"].endswith("base/step_00000150") and i["step"] == 150, i
assert i["fingerprint"].startswith("0x") and len(i["fingerprint"]) == 18, i
assert "init_from" not in base, "a run from initialised weights records none"
assert m["step"] == 1, m["step"]
EOF

# ---- packed equals padded -------------------------------------------------------------------
finetune 1 count --set train.global_batch=1 --set train.steps=1 || finish
samples=$(sed -n 's/.* examples in \([0-9]*\) samples.*/\1/p' "$tmp/count.log")
[[ $samples -gt 0 && $samples -lt $((examples / 2)) ]] ||
  fail "packing: $examples examples in '$samples' samples, expected at least two per sample"
finetune 1 packed --set data.packing=true --set train.global_batch="$samples" \
  --set train.steps=1 --set checkpoint.every=1 "${quiet_adam[@]}" || finish
for run in padded packed; do
  "$jumbo" ckpt export --format safetensors "$tmp/$run" -o "$tmp/$run.safetensors" >/dev/null
done
$py - "$tmp/padded.jsonl" "$tmp/packed.jsonl" "$tmp/padded.safetensors" "$tmp/packed.safetensors" <<'EOF' ||
import json, sys
import numpy as np
sys.path.insert(0, "tests/infer")
from torch_gpt2 import read_safetensors  # the one safetensors reader of the tests
a, b = (json.loads(open(p).readline()) for p in sys.argv[1:3])
assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]), (a["loss"], b["loss"])
x, y = ({k: v[2] for k, v in read_safetensors(p)[1].items()} for p in sys.argv[3:5])
assert sorted(x) == sorted(y), (sorted(x), sorted(y))
worst = max(float(np.max(np.abs(x[k] - y[k]))) for k in x)
assert worst <= 1e-6, f"weights after the step differ by {worst}"
print(f"packed = padded: loss {a['loss']!r} vs {b['loss']!r}, weights within {worst:.1e}")
EOF
  fail "packing differs from one example per sample"

# ---- layouts --------------------------------------------------------------------------------
finetune 1 solo --set train.global_batch=4 --set train.steps=3 || finish
finetune 8 grid --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero1=true \
  --set train.global_batch=4 --set train.steps=3 || finish
$py - "$tmp/solo.jsonl" "$tmp/grid.jsonl" <<'EOF' || fail "tp 2 x pp 2 x dp 2 differs from one rank"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 3, (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-5 * abs(x), (a, b)
print("tp 2 x pp 2 x dp 2 (ZeRO-1) = one rank:", a, b)
EOF

# ---- resume ---------------------------------------------------------------------------------
finetune 1 unbroken --set train.global_batch=4 --set train.steps=4 --set checkpoint.every=2 || finish
mkdir -p "$tmp/resumed" && cp -r "$tmp/unbroken/step_00000002" "$tmp/resumed/"
echo step_00000002 >"$tmp/resumed/latest"
finetune 1 resumed --set train.global_batch=4 --set train.steps=4 --set checkpoint.every=2 \
  --set checkpoint.resume=auto || finish
grep -q "init_from" "$tmp/resumed.log" && fail "a resumed fine-tune loaded train.init_from again"
[[ $(losses "$tmp/resumed.jsonl") == $(losses "$tmp/unbroken.jsonl" | tail -2) ]] ||
  fail "the resumed fine-tune's steps 3, 4 differ from the unbroken run's"
cmp -s <($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["init_from"])' \
  "$tmp/resumed/step_00000004/manifest.json") \
  <($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["init_from"])' "$manifest") ||
  fail "the resumed run's manifest lost where its weights came from"

# ---- LoRA -----------------------------------------------------------------------------------
lora=(--set finetune.method=lora --set finetune.lora_rank=4 --set finetune.lora_alpha=8)
# B starts at zero: the first step is the base model's, exactly (the full fine-tune's loss).
finetune 1 lora_padded "${lora[@]}" --set data.packing=false --set train.global_batch="$examples" \
  --set train.steps=1 --set checkpoint.every=1 || finish
[[ $(first_loss "$tmp/lora_padded.jsonl") == "$(first_loss "$tmp/padded.jsonl")" ]] ||
  fail "LoRA's first step ($(first_loss "$tmp/lora_padded.jsonl")) is not the base model's ($(first_loss "$tmp/padded.jsonl"))"
grep -q "init_from: the frozen base .*base/step_00000150.* LoRA rank 4 on qkv, proj, fc1, fc2" "$tmp/lora_padded.log" ||
  fail "the LoRA run does not name its frozen base and adapters"
# Layouts: tensor parallelism shards the adapters as their base maps; ZeRO-1 their state.
finetune 1 lora_solo "${lora[@]}" --set train.global_batch=4 --set train.steps=3 || finish
finetune 8 lora_grid "${lora[@]}" --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero1=true \
  --set parallel.sequence_parallel=true --set train.global_batch=4 --set train.steps=3 || finish
$py - "$tmp/lora_solo.jsonl" "$tmp/lora_grid.jsonl" <<'EOF2' || fail "LoRA: tp 2 x pp 2 x dp 2 differs from one rank"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 3 and a[2] < a[0], (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-5 * abs(x), (a, b)
print("LoRA: tp 2 x pp 2 x dp 2 (ZeRO-1, sequence parallel) = one rank:", a, b)
EOF2
# Resume: the adapters and their Adam state from the checkpoint, the base from its init_from.
finetune 1 lora_unbroken "${lora[@]}" --set train.global_batch=4 --set train.steps=4 \
  --set checkpoint.every=2 --set "data.valid=$tmp/data" --set train.eval_every=4 \
  --set train.eval_batches=4 || finish
mkdir -p "$tmp/lora_resumed" && cp -r "$tmp/lora_unbroken/step_00000002" "$tmp/lora_resumed/"
echo step_00000002 >"$tmp/lora_resumed/latest"
finetune 1 lora_resumed "${lora[@]}" --set train.global_batch=4 --set train.steps=4 \
  --set checkpoint.every=2 --set checkpoint.resume=auto || finish
[[ $(losses "$tmp/lora_resumed.jsonl") == $(losses "$tmp/lora_unbroken.jsonl" | tail -2) ]] ||
  fail "the resumed LoRA run's steps 3, 4 differ from the unbroken run's"
# LoRA dropout: the adapters' inputs dropped out in training only. Steps differ from the
# undropped run's, a resume draws the same masks (bit-identical), and the validation loss is
# what an undropped evaluation of the checkpoint gives (eval --adapter, below).
drop=(--set finetune.lora_dropout=0.1 --set train.global_batch=4 --set train.steps=4
  --set checkpoint.every=2)
finetune 1 drop_unbroken "${lora[@]}" "${drop[@]}" --set "data.valid=$tmp/data" \
  --set train.eval_every=4 --set train.eval_batches=4 || finish
mkdir -p "$tmp/drop_resumed" && cp -r "$tmp/drop_unbroken/step_00000002" "$tmp/drop_resumed/"
echo step_00000002 >"$tmp/drop_resumed/latest"
finetune 1 drop_resumed "${lora[@]}" "${drop[@]}" --set checkpoint.resume=auto || finish
[[ $(losses "$tmp/drop_resumed.jsonl") == $(losses "$tmp/drop_unbroken.jsonl" | tail -2) ]] ||
  fail "the resumed LoRA-dropout run's steps 3, 4 differ from the unbroken run's"
# Step 1 is the base's either way (B = 0); B's first update saw the dropped inputs.
[[ $(losses "$tmp/drop_unbroken.jsonl" | sed -n 2p) != $(losses "$tmp/lora_unbroken.jsonl" | sed -n 2p) ]] ||
  fail "finetune.lora_dropout = 0.1 changed nothing in step 2"
"$jumbo" eval --checkpoint "$tmp/base" --adapter "$tmp/drop_unbroken" --data "$tmp/data" \
  --windows 4 >"$tmp/drop_eval.log" 2>&1 || { cat "$tmp/drop_eval.log"; fail "eval of the dropout run"; }
$py - "$tmp/drop_unbroken.jsonl" "$tmp/drop_eval.log" <<'EOF2' || fail "LoRA dropout reached the evaluation"
import json, sys
val = [json.loads(l) for l in open(sys.argv[1])][-1]["val_loss"]
got = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])["data"]["loss"]
assert got == val, (got, val)
print(f"LoRA dropout 0.1: val_loss {val!r} = eval --adapter (nothing dropped in evaluation)")
EOF2
# The checkpoint holds the adapters alone, and says so.
$py - "$tmp/lora_unbroken/step_00000004" "$tmp/padded/step_00000001" <<'EOF2' || fail "the LoRA checkpoint"
import json, os, sys
lora, full = sys.argv[1:3]
m = json.load(open(os.path.join(lora, "manifest.json")))
assert m["lora"] == {"rank": 4, "alpha": 8.0, "targets": "qkv,proj,fc1,fc2"}, m["lora"]
assert all(".lora_" in name for name in m["tensors"]), sorted(m["tensors"])[:3]
assert len(m["tensors"]) == 2 * 4 * 2, len(m["tensors"])  # layers x targets x (A, B)
size = lambda d: sum(f["bytes"] for f in json.load(open(os.path.join(d, "manifest.json")))["files"])
print(f"LoRA checkpoint: {size(lora)} bytes of shards, the full fine-tune's {size(full)}")
assert size(lora) * 5 < size(full)
EOF2
# Merged: the base with (alpha / r) B A added equals the adapters' model. Its loss over the
# validation windows equals the LoRA run's last val_loss.
check "merge" "$jumbo" ckpt merge --adapter "$tmp/lora_unbroken" -o "$tmp/merged" >"$tmp/merge.log"
cat "$tmp/merge.log"
"$jumbo" eval --checkpoint "$tmp/merged" --data "$tmp/data" --windows 4 >"$tmp/merged_eval.log" 2>&1 ||
  { cat "$tmp/merged_eval.log"; fail "eval of the merged checkpoint"; }
$py - "$tmp/lora_unbroken.jsonl" "$tmp/merged_eval.log" <<'EOF2' || fail "merged differs from the adapters"
import json, sys
val = [json.loads(l) for l in open(sys.argv[1])][-1]["val_loss"]
merged = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])["data"]["loss"]
assert abs(val - merged) <= 1e-5 * abs(val), (val, merged)
print(f"merged: eval loss {merged!r}, the LoRA run's val_loss {val!r}")
EOF2
# Unmerged: eval --adapter runs the frozen base with the adapters (one rank, and tp 2 x pp 2
# reading the adapters saved at tp 1), the same loss.
"$jumbo" eval --checkpoint "$tmp/base" --adapter "$tmp/lora_unbroken" --data "$tmp/data" \
  --windows 4 >"$tmp/adapter_eval.log" 2>&1 || { cat "$tmp/adapter_eval.log"; fail "eval --adapter"; }
mpirun -np 4 "$jumbo" eval --checkpoint "$tmp/base" --adapter "$tmp/lora_unbroken" --tp 2 --pp 2 \
  --data "$tmp/data" --windows 4 >"$tmp/adapter_eval4.log" 2>&1 ||
  { cat "$tmp/adapter_eval4.log"; fail "eval --adapter --tp 2 --pp 2"; }
$py - "$tmp/merged_eval.log" "$tmp/adapter_eval.log" "$tmp/adapter_eval4.log" <<'EOF2' ||
import json, sys
merged, one, grid = (json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[1:4])
assert one["adapter"].endswith("lora_unbroken/step_00000004"), one["adapter"]
for run in (one, grid):
    got, want = run["data"]["loss"], merged["data"]["loss"]
    assert abs(got - want) <= 1e-5 * abs(want), (run["layout"], got, want)
print(f"eval --adapter: loss {one['data']['loss']!r} (tp2 x pp2 {grid['data']['loss']!r}), "
      f"merged {merged['data']['loss']!r}")
EOF2
  fail "eval --adapter differs from the merged checkpoint"
expect_error eval_full_adapter "--adapter .*padded.*: not a LoRA checkpoint" \
  "$jumbo" eval --checkpoint "$tmp/base" --adapter "$tmp/padded" --data "$tmp/data" --windows 1
expect_error merge_full "--adapter .*padded: not a LoRA checkpoint" \
  "$jumbo" ckpt merge --adapter "$tmp/padded" -o "$tmp/merged_again"
expect_error lora_no_base "finetune.method = \"lora\" but train.init_from is empty" \
  "$jumbo" train --set model.preset=inputs/models/tiny.toml "${ctx[@]}" --set parallel.micro_batch=1 \
  --set "data.train=$tmp/sft" --set "data.tokenizer=$tmp/tok.model" --set data.valid= \
  --set train.steps=1 --set train.global_batch=1 --set log.peak_tflops=1 --set train.eval_every=0 \
  --set finetune.method=lora

# ---- user mistakes --------------------------------------------------------------------------
expect_error other_shape "train.init_from = .*base: model.layers = 2 in the checkpoint, but .* says 3" \
  "$jumbo" train --set model.preset=inputs/models/tiny.toml "${ctx[@]}" --set model.layers=3 --set parallel.micro_batch=1 \
  --set "data.train=$tmp/sft" --set "data.tokenizer=$tmp/tok.model" --set data.valid= \
  --set train.steps=1 --set train.global_batch=1 --set log.peak_tflops=1 --set train.eval_every=0 \
  --set "train.init_from=$tmp/base"
expect_error full_from_adapters "train.init_from = .*lora_unbroken: a LoRA checkpoint .adapters only.; a full fine-tune starts from a full checkpoint" \
  "$jumbo" train --set model.preset=inputs/models/tiny.toml "${ctx[@]}" --set parallel.micro_batch=1 \
  --set "data.train=$tmp/sft" --set "data.tokenizer=$tmp/tok.model" --set data.valid= \
  --set train.steps=1 --set train.global_batch=1 --set log.peak_tflops=1 --set train.eval_every=0 \
  --set "train.init_from=$tmp/lora_unbroken"
# A damaged base shard under data parallelism: dp rank 0 reads it, its replica waits for the
# broadcast; both end with the reader's line instead of one waiting forever.
cp -r "$tmp/base" "$tmp/damaged_base"
truncate -s 100 "$tmp"/damaged_base/step_00000150/tp0-pp0-dp0.h5
status=0
timeout 120 mpirun -np 2 "$jumbo" train --set model.preset=inputs/models/tiny.toml "${ctx[@]}" \
  --set parallel.micro_batch=1 --set "data.train=$tmp/sft" --set "data.tokenizer=$tmp/tok.model" \
  --set data.valid= --set train.steps=1 --set train.global_batch=2 --set log.peak_tflops=1 \
  --set train.eval_every=0 --set "train.init_from=$tmp/damaged_base" "${lora[@]}" \
  >"$tmp/damaged.out" 2>"$tmp/damaged.err" || status=$?
[[ $status -eq 2 ]] || fail "a damaged base under dp 2: exit $status, expected 2 (124: it hung)"
for r in 0 1; do  # each rank says why, the replica naming the reader
  grep -qE "^jumbo: rank $r: error: (rank 0: )?.*damaged_base/step_00000150/tp0-pp0-dp0.h5: 100 bytes, the manifest says" \
    "$tmp/damaged.err" || fail "a damaged base under dp 2: no line from rank $r: $(cat "$tmp/damaged.err")"
done
echo '{"prompt": "Genre:"}' >"$tmp/no_completion.jsonl"
expect_error no_completion "no_completion.jsonl:1: no such key, expected a string field \"completion\"" \
  "$jumbo" data prepare --format prompt-completion --input "$tmp/no_completion.jsonl" \
  --tokenizer "$tmp/tok.model" --output "$tmp/bad"
echo 'plain text' >"$tmp/notes.txt"
expect_error text_input "notes.txt: not a .jsonl file; prompt-completion examples are JSON lines" \
  "$jumbo" data prepare --format prompt-completion --input "$tmp/notes.txt" \
  --tokenizer "$tmp/tok.model" --output "$tmp/bad"
expect_error bad_format "--format chat: expected text or prompt-completion" \
  "$jumbo" data prepare --format chat --input "$tmp/sft.jsonl" --tokenizer "$tmp/tok.model" \
  --output "$tmp/bad"
finish
