#!/usr/bin/env bash
# Fine-tunes the demo GPT to name the Brown genre of a paragraph, and scores the base and the
# fine-tuned model on the shipped genre task (inputs/tasks/brown-genre.jsonl: 15 genres,
# chance 1/15; scripts/make-genre-task.py and inputs/data/README.md say how it is made):
#   1. builds jumbo, makes the demo tokenizer and tokenized corpus if missing (as demo.sh);
#   2. the base: $demo/checkpoints if it holds a checkpoint (what `scripts/demo.sh` leaves),
#      else a short pre-training of the demo run into $demo/base (JUMBO_BASE_STEPS steps,
#      default 300; kept and reused by the next run with the same number of steps);
#   3. prepares inputs/data/brown-genre-train.jsonl (2972 prompt-completion examples: a
#      paragraph and "\nGenre:", the genre's name) with `jumbo data prepare --format
#      prompt-completion`;
#   4. fine-tunes all the weights from the base (train.init_from: a fresh optimizer from step
#      0), JUMBO_FINETUNE_STEPS steps (default 150) of 16 samples (2689 samples are an
#      epoch of the packed examples) at a peak learning rate JUMBO_FINETUNE_LR
#      (default 1e-3) after a warm-up of a tenth of the steps, cosine to a tenth of it, into
#      $demo/finetuned; its val_loss is the loss of the task's right answers;
#   5. the same with LoRA (finetune.method = "lora", rank 16 on every map, JUMBO_LORA_LR,
#      default 3e-3) into $demo/lora, merged into a full checkpoint by `jumbo ckpt merge`
#      ($demo/lora-merged);
#   6. `jumbo eval --task` of the base, the fully fine-tuned and the LoRA checkpoint, and a
#      table of the three against chance.
# Arguments go to the fine-tuning `jumbo train` (they win over the script's --set), e.g.
#   scripts/finetune-demo.sh --set train.global_batch=32 --set train.lr=5e-4
# JUMBO_BUILD_DIR (default build) and JUMBO_DEMO_DIR (default build/demo) as for demo.sh;
# JUMBO_GENRE_TASK (default inputs/tasks/brown-genre.jsonl) scores another task file (the
# test scores a few items of it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${JUMBO_BUILD_DIR:-build}
demo=${JUMBO_DEMO_DIR:-build/demo}
base_steps=${JUMBO_BASE_STEPS:-300}
ft_steps=${JUMBO_FINETUNE_STEPS:-150}
ft_lr=${JUMBO_FINETUNE_LR:-1e-3}
lora_lr=${JUMBO_LORA_LR:-3e-3}
task=${JUMBO_GENRE_TASK:-inputs/tasks/brown-genre.jsonl}
started=$(date +%s)

source scripts/demo-data.sh
demo_build
demo_data

# The embedded demo run (inputs/runs/demo.toml) with this demo directory's files.
paths=(--set "data.train=$demo/brown-train" --set "data.valid=$demo/brown-valid"
       --set "data.tokenizer=$demo/brown-4k.model")
elapsed() { local s=$(($(date +%s) - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# ---- the base ---------------------------------------------------------------------------
if [[ -f $demo/checkpoints/latest ]]; then
  base=$demo/checkpoints
  echo "finetune-demo: the base is the demo run's checkpoint $base/$(cat "$base/latest")"
else
  base=$demo/base
  step_dir=$(printf 'step_%08d' "$base_steps")
  if [[ -f $base/latest && $(cat "$base/latest") == "$step_dir" ]]; then
    echo "finetune-demo: the base is $base/$step_dir, pre-trained by an earlier run"
  else
    echo "finetune-demo: pre-training the base, $base_steps steps of the demo run ($base)"
    rm -rf "$base"
    t=$(date +%s)
    # The demo's warm-up (200K tokens, ~50 steps) scaled down with a shorter run.
    warmup=$((base_steps * 32 * 128 / 6))
    ((warmup < 200000)) || warmup=200000
    "$jumbo" train "${paths[@]}" --set "log.metrics_file=$demo/base-metrics.jsonl" \
      --set "train.steps=$base_steps" --set "train.warmup_tokens=$warmup" \
      --set "checkpoint.dir=$base" --set "checkpoint.every=$base_steps"
    echo "finetune-demo: pre-trained the base in $(elapsed "$t")"
  fi
fi

# ---- the fine-tuning data ---------------------------------------------------------------
sft=$demo/brown-genre-train
if [[ ! -f $sft.parts || $demo/brown-4k.model -nt $sft.parts ||
      inputs/data/brown-genre-train.jsonl -nt $sft.parts ]]; then
  echo "finetune-demo: tokenizing inputs/data/brown-genre-train.jsonl ($sft.parts)"
  "$jumbo" data prepare --format prompt-completion --input inputs/data/brown-genre-train.jsonl \
    --tokenizer "$demo/brown-4k.model" --output "$sft"
fi
# Validation during the fine-tune: the task's items as examples (context, right answer).
python3 - "$task" "$demo/brown-genre-valid.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], encoding="utf-8") as f, open(sys.argv[2], "w", encoding="utf-8") as out:
    for line in f:
        item = json.loads(line)
        out.write(json.dumps({"prompt": item["context"],
                              "completion": item["continuations"][item["answer"]]}) + "\n")
PY
"$jumbo" data prepare --format prompt-completion --input "$demo/brown-genre-valid.jsonl" \
  --tokenizer "$demo/brown-4k.model" --output "$demo/brown-genre-valid" --progress-every 0 >/dev/null

# ---- the fine-tunes ---------------------------------------------------------------------
# finetune NAME LR [--set ...]: from the base into $demo/NAME; the script's arguments win.
finetune() {
  local name=$1 lr=$2
  shift 2
  echo "finetune-demo: fine-tuning $base for $ft_steps steps at lr $lr ($demo/$name${*:+: $*})"
  rm -rf "${demo:?}/$name"
  local t
  t=$(date +%s)
  "$jumbo" train "${paths[@]}" --set "data.train=$sft" --set "data.valid=$demo/brown-genre-valid" \
    --set "train.init_from=$base" --set "train.steps=$ft_steps" --set train.global_batch=16 \
    --set "train.lr=$lr" --set "train.min_lr=$(python3 -c "print($lr / 10)")" \
    --set "train.warmup_tokens=$((ft_steps * 16 * 128 / 10))" \
    --set "train.eval_every=$(((ft_steps + 3) / 4))" \
    --set "log.metrics_file=$demo/$name-metrics.jsonl" \
    --set "checkpoint.dir=$demo/$name" --set "checkpoint.every=$ft_steps" "$@" "${extra[@]}"
  echo "finetune-demo: $name in $(elapsed "$t")"
}
extra=("$@")
finetune finetuned "$ft_lr"
finetune lora "$lora_lr" --set finetune.method=lora --set finetune.lora_rank=16 \
  --set finetune.lora_alpha=32
rm -rf "$demo/lora-merged"
"$jumbo" ckpt merge --adapter "$demo/lora" -o "$demo/lora-merged"

# ---- the task ---------------------------------------------------------------------------
t=$(date +%s)
for model in base finetuned lora-merged; do
  ckpt=$base
  [[ $model == base ]] || ckpt=$demo/$model
  echo "finetune-demo: jumbo eval --checkpoint $ckpt --task $task"
  "$jumbo" eval --checkpoint "$ckpt" --task "$task" --micro-batch 60 | tee "$demo/eval-$model.txt"
done
echo "finetune-demo: scored the task three times in $(elapsed "$t")"

python3 - "$task" "$demo/eval-base.txt" "$demo/eval-finetuned.txt" "$demo/eval-lora-merged.txt" \
  "$base" "$demo/finetuned" "$demo/lora (merged)" <<'PY'
import json, sys
task, base_out, ft_out, lora_out, base_dir, ft_dir, lora_dir = sys.argv[1:]
items = [json.loads(l) for l in open(task, encoding="utf-8")]
n = len(items[0]["continuations"])
rows = [("chance", f"1/{n}", 1 / n, 1 / n)]
for label, path, where in (("base", base_out, base_dir), ("full", ft_out, ft_dir),
                          ("LoRA r16", lora_out, lora_dir)):
    r = json.loads(open(path).read().strip().splitlines()[-1])
    rows.append((label, f"{where} (step {r['step']})", r["task"]["accuracy"], r["task"]["accuracy_norm"]))
print(f"\nbase vs fine-tuned (full, LoRA) accuracy: {task}, {len(items)} items, {n} genres")
print(f"{'model':<12} {'checkpoint':<40} {'acc':>7} {'acc_norm':>9}")
for label, where, acc, norm in rows:
    print(f"{label:<12} {where:<40} {acc:>7.4f} {norm:>9.4f}")
PY
echo "finetune-demo: done in $(elapsed "$started")"
