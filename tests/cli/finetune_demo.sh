#!/usr/bin/env bash
# scripts/finetune-demo.sh end to end, on a very short base and fine-tune: in a temp demo
# directory it makes the demo tokenizer and data, pre-trains a base (5 steps), prepares the
# genre examples (prompt-completion), fine-tunes from the base (5 steps) in full and with LoRA
# (merged by jumbo ckpt merge), scores the three on the first 30 items of the genre task and
# prints the table "base vs fine-tuned (full, LoRA) accuracy" with chance (1/15); the lines must be there and their accuracies parse. With so few steps the
# accuracies are not checked against chance (a 5-step model is not above it).
# First, scripts/make-genre-task.py must reproduce the shipped
# inputs/data/brown-genre-train.jsonl and inputs/tasks/brown-genre.jsonl byte for byte.
# Usage: finetune_demo.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"

# ---- the shipped files ------------------------------------------------------------------
check "make-genre-task.py" python3 scripts/make-genre-task.py \
  --train-output "$tmp/genre-train.jsonl" --task-output "$tmp/genre-task.jsonl" 2>/dev/null
cmp inputs/data/brown-genre-train.jsonl "$tmp/genre-train.jsonl" ||
  fail "scripts/make-genre-task.py does not reproduce inputs/data/brown-genre-train.jsonl"
cmp inputs/tasks/brown-genre.jsonl "$tmp/genre-task.jsonl" ||
  fail "scripts/make-genre-task.py does not reproduce inputs/tasks/brown-genre.jsonl"
python3 - <<'PY' || fail "the genre files' shape"
import json
train = [json.loads(l) for l in open("inputs/data/brown-genre-train.jsonl", encoding="utf-8")]
task = [json.loads(l) for l in open("inputs/tasks/brown-genre.jsonl", encoding="utf-8")]
names = task[0]["continuations"]
assert len(names) == len(set(names)) == 15, names
for item in task:
    assert item["continuations"] == names and 0 <= item["answer"] < 15, item
    assert item["context"].endswith("\nGenre:") and len(item["context"]) <= 300 + 7, item
for ex in train:
    assert ex["prompt"].endswith("\nGenre:") and ex["completion"] in names, ex
assert 100 <= len(task) <= 1000 and 1000 <= len(train) <= 5000, (len(task), len(train))
print(f"ok: {len(train)} examples, {len(task)} items of {len(names)} genres")
PY

# ---- the script -------------------------------------------------------------------------
head -30 inputs/tasks/brown-genre.jsonl >"$tmp/task.jsonl"
start=$(date +%s)
JUMBO_BUILD_DIR=$(dirname "$jumbo") JUMBO_DEMO_DIR=$tmp/demo JUMBO_BASE_STEPS=5 \
  JUMBO_FINETUNE_STEPS=5 JUMBO_GENRE_TASK=$tmp/task.jsonl \
  bash scripts/finetune-demo.sh >"$tmp/log" 2>&1 ||
  { cat "$tmp/log"; fail "scripts/finetune-demo.sh exited $?"; finish; }
echo "finetune-demo.sh took $(($(date +%s) - start)) s"
sed -n '/^base vs fine-tuned (full, LoRA) accuracy/,$p' "$tmp/log"

grep -q "init_from: the weights of $tmp/demo/base/step_00000005" "$tmp/log" ||
  fail "the fine-tune did not start from the base"
python3 - "$tmp/log" "$tmp/demo" <<'PY' || fail "the accuracy table"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
demo = sys.argv[2]
head = [i for i, l in enumerate(lines) if l.startswith("base vs fine-tuned (full, LoRA) accuracy:")]
assert len(head) == 1, "no line 'base vs fine-tuned (full, LoRA) accuracy:'"
assert "30 items, 15 genres" in lines[head[0]], lines[head[0]]
rows = {}
for l in lines[head[0] + 2:head[0] + 6]:
    m = re.fullmatch(r"(chance|base|full|LoRA r16) +(.+?) +([01]\.\d{4}) +([01]\.\d{4})", l)
    assert m, f"not a table row: {l!r}"
    rows[m[1]] = (m[2], float(m[3]), float(m[4]))
assert list(rows) == ["chance", "base", "full", "LoRA r16"], rows
assert rows["chance"][1:] == (0.0667, 0.0667), rows["chance"]
assert rows["base"][0] == f"{demo}/base (step 5)", rows["base"]
assert rows["full"][0] == f"{demo}/finetuned (step 5)", rows["full"]
assert rows["LoRA r16"][0] == f"{demo}/lora (merged) (step 0)", rows["LoRA r16"]
for label, (_, acc, norm) in rows.items():
    assert 0 <= acc <= 1 and 0 <= norm <= 1, (label, acc, norm)
    assert round(acc * 30, 2).is_integer(), f"{label}: {acc} is not a count of 30 items"
print("ok:", {k: v[1:] for k, v in rows.items()})
PY
finish
