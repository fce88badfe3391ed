#!/usr/bin/env bash
# The README's demo command, end to end: scripts/demo.sh makes the tokenizer and datasets
# from the shipped Brown corpus and trains the embedded demo run, here on half its steps (150
# of 300, warmup and cosine scaled with them: the test's longest part was the demo's 300
# steps); the validation loss must end at least 2 nats below ln(vocab) = ln(4096) = 8.318
# (the full demo ends near 5.66, 2.66 below; 150 steps end near 6.1). Then the campaign's last
# steps on the checkpoint the demo keeps (DEMO_DIR/checkpoints, made afresh: a previous run's
# is gone): jumbo eval of the validation split and the shipped last-word task (above chance),
# and the three commands the demo prints to try the model, run as printed: jumbo generate,
# jumbo serve (on a free port) and the curl completion request to it.
# Usage: demo_end_to_end.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/serve_harness.sh
abort_on_error
stop_at_first_failure
on_exit stop_server_now

# What an earlier demo run would have left: the rerun must replace it, not fail on it.
mkdir -p "$tmp/checkpoints/step_00000007"
echo step_00000007 >"$tmp/checkpoints/latest"
start=$(date +%s)
JUMBO_BUILD_DIR=$(dirname "$jumbo") JUMBO_DEMO_DIR=$tmp bash scripts/demo.sh \
  --set train.steps=150 --set train.warmup_tokens=100_000 | tee "$tmp/log"
elapsed=$(($(date +%s) - start))
[[ $(cat "$tmp/checkpoints/latest") == step_00000150 && -f $tmp/checkpoints/step_00000150/manifest.json &&
   ! -e $tmp/checkpoints/step_00000007 ]] ||
  { ls -R "$tmp/checkpoints"; fail "the demo did not keep a fresh checkpoint in $tmp/checkpoints"; }
echo "ok: the demo kept $tmp/checkpoints/step_00000150"

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
"$jumbo" eval --checkpoint "$tmp/checkpoints" --data "$tmp/brown-valid" --task "$tmp/task.jsonl" | tee "$tmp/eval.txt"
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

# The commands the demo printed, as printed (paths relative to the repository root, here).
printed() { grep -E "$1" "$tmp/log" || fail "the demo printed no line matching '$1'"; }
eval "generate=($(printed '^  .* generate --checkpoint '))"
eval "serve=($(printed '^  .* serve --checkpoint '))"
request=$(sed -n '/^  curl /{N;p;}' "$tmp/log")
[[ $request == *localhost:8000/v1/completions* ]] || fail "no curl request printed: $request"
"${generate[@]}" | tee "$tmp/gen.txt"
grep -q "^The jury said." "$tmp/gen.txt" || fail "the printed generate command completed nothing"
# The printed serve command on a free port (8000 may be taken here), the request sent to it
# (start_server polls with commands that fail until the server listens: no set -e).
set +e
start_server demo "${serve[@]}" --port 0 || exit 1
set -e
eval "${request/localhost:8000/localhost:$port}" >"$tmp/response.json"
python3 - "$tmp/response.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["model"] == "demo" and r["choices"][0]["text"].strip(), r
print(f"ok: the printed curl request completed {r['choices'][0]['text']!r}")
PY
stop_server demo
finish
