#!/usr/bin/env bash
# The README's demo command, end to end: scripts/demo.sh makes the tokenizer and datasets
# from the shipped Brown corpus and trains the embedded demo run, here on half its steps (150
# of 300, warmup and cosine scaled with them: the test's longest part was the demo's 300
# steps); the validation loss must end at least 2 nats below ln(vocab) = ln(4096) = 8.318
# (the full demo ends near 5.66, 2.66 below; 150 steps end near 6.1). Then the campaign's last
# steps on its checkpoint: jumbo eval of the validation split and the shipped last-word task
# (above chance), and jumbo generate. Usage: demo_end_to_end.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
abort_on_error
stop_at_first_failure

start=$(date +%s)
JUMBO_BUILD_DIR=$(dirname "$jumbo") JUMBO_DEMO_DIR=$tmp bash scripts/demo.sh \
  --set "checkpoint.dir=$tmp/ckpt" --set checkpoint.every=100000 --set train.steps=150 \
  --set train.warmup_tokens=100_000 | tee "$tmp/log"
elapsed=$(($(date +%s) - start))

val=$(python3 -c '
import json, sys
vals = [json.loads(l).get("val_loss") for l in open(sys.argv[1])]
vals = [v for v in vals if v is not None]
print(vals[-1])' "$tmp/metrics.jsonl")
echo "demo: final validation loss $val after ${elapsed}s"
python3 -c '
import math, sys
val = float(sys.argv[1]); bound = math.log(4096) - 2.0
if val > bound:
    sys.exit(f"validation loss {val:.4f} is above ln(4096) - 2 = {bound:.4f}")
print(f"ok: {val:.4f} <= {bound:.4f}")' "$val"

# The trained checkpoint (saved at the last step): every validation token scored once, and
# the first 200 items of the last-word task, where chance is 25%.
head -200 inputs/tasks/brown-lastword.jsonl >"$tmp/task.jsonl"
"$jumbo" eval --checkpoint "$tmp/ckpt" --data "$tmp/brown-valid" --task "$tmp/task.jsonl" | tee "$tmp/eval.txt"
python3 - "$tmp/eval.txt" "$val" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
d, t, val = r["data"], r["task"], float(sys.argv[2])
assert d["tokens"] == d["dataset_tokens"] - 1, d
assert abs(d["loss"] - val) < 0.25, f"whole-split loss {d['loss']:.4f}, run val_loss {val:.4f}"
assert t["items"] == 200 and t["accuracy"] > 0.30, t
print(f"ok: eval loss {d['loss']:.4f} over {d['tokens']} tokens, {d['bits_per_byte']:.3f} "
      f"bits/byte; last-word acc {t['accuracy']:.3f} (chance 0.25)")
PY
"$jumbo" generate --checkpoint "$tmp/ckpt" --prompt "The jury said" --max-new-tokens 24 | tee "$tmp/gen.txt"
grep -q "^The jury said." "$tmp/gen.txt" || { echo "FAIL: no completion"; exit 1; }
finish
