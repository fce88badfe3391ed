#!/usr/bin/env bash
# jumbo eval on a checkpoint saved by a tp 2 run: its first windows reproduce the run's logged
# val_loss on other layouts, the whole set scores every token once (any stride), the shipped
# multiple-choice task gives the same log-likelihoods on every layout, and mistakes get one line.
source "$(dirname "$0")/../support/harness.sh" "$@"
abort_on_error
stop_at_first_failure
source tests/support/small_run.sh
make_small_data "$jumbo" "$tmp"
train_small "$jumbo" 2 "$tmp" --set parallel.tp=2 --set train.steps=10 --set train.global_batch=8 \
  --set checkpoint.dir="$tmp/ckpt" --set checkpoint.every=10 --set "data.valid=$tmp/data" \
  --set train.eval_every=10 --set train.eval_batches=4 --set "log.metrics_file=$tmp/m.jsonl" \
  >/dev/null
field() {  # field FILE PATH.TO.KEY: from the last JSON line of FILE
  python3 -c 'import json,sys
d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for k in sys.argv[2].split("."): d=d[k]
print(repr(d))' "$1" "$2"
}
close() {  # close A B RELATIVE
  python3 -c 'import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=t*max(1,abs(b)) else 1)' "$@" ||
    fail "$1 vs $2 (tolerance $3)"
}
val=$(field "$tmp/m.jsonl" val_loss)
echo "logged val_loss at step 10: $val"

# 4 windows = train.eval_batches x micro_batch: the windows the run evaluated. The run's own
# layout gives its number to double rounding; others differ by fp32 sums in another order.
mpirun -np 2 "$jumbo" eval --checkpoint "$tmp/ckpt" --data "$tmp/data" --windows 4 --tp 2 \
  >"$tmp/e0.txt"
close "$(field "$tmp/e0.txt" data.loss)" "$val" 1e-12
"$jumbo" eval --checkpoint "$tmp/ckpt" --data "$tmp/data" --windows 4 >"$tmp/e1.txt"
close "$(field "$tmp/e1.txt" data.loss)" "$val" 1e-6
mpirun -np 4 "$jumbo" eval --checkpoint "$tmp/ckpt" --data "$tmp/data" --windows 4 --pp 2 \
  --micro-batch 2 >"$tmp/e2.txt"
close "$(field "$tmp/e2.txt" data.loss)" "$val" 1e-6
[[ $(field "$tmp/e2.txt" layout) == "'tp1-pp2-dp2'" ]] || fail "layout"
# Under NCCL's rules on CPU ranks: the forward-only pipeline's loss to the last digit.
mpirun -np 4 "$jumbo" eval --checkpoint "$tmp/ckpt" --data "$tmp/data" --windows 4 --pp 2 \
  --micro-batch 2 --comm-emulate nccl >"$tmp/e3.txt"
[[ $(field "$tmp/e3.txt" data.loss) == "$(field "$tmp/e2.txt" data.loss)" ]] ||
  fail "eval under comm emulation: $(field "$tmp/e3.txt" data.loss) vs $(field "$tmp/e2.txt" data.loss)"
grep -q "^dataset .*bits/byte" "$tmp/e2.txt" || { cat "$tmp/e2.txt"; fail "no table"; }

# The whole set: every token but the first is scored once, whatever the stride.
"$jumbo" eval --checkpoint "$tmp/ckpt" --data "$tmp/data" >"$tmp/all.txt"
n=$(field "$tmp/all.txt" data.dataset_tokens)
[[ $(field "$tmp/all.txt" data.tokens) == $((n - 1)) ]] || fail "tokens scored"
mpirun -np 4 "$jumbo" eval --checkpoint "$tmp/ckpt" --data "$tmp/data" --stride 12 --tp 2 \
  --pp 2 >"$tmp/strided.txt"
[[ $(field "$tmp/strided.txt" data.tokens) == $((n - 1)) ]] || fail "strided tokens"
w32=$(field "$tmp/all.txt" data.windows) w12=$(field "$tmp/strided.txt" data.windows)
((w12 > 2 * w32)) || fail "stride 12 made $w12 windows, stride 32 $w32"

# The shipped task (its first 60 items): the same per-item log-likelihoods on two layouts.
head -60 inputs/tasks/brown-lastword.jsonl >"$tmp/task.jsonl"
"$jumbo" eval --checkpoint "$tmp/ckpt" --task "$tmp/task.jsonl" --per-item "$tmp/items1.jsonl" \
  >"$tmp/t1.txt"
mpirun -np 4 "$jumbo" eval --checkpoint "$tmp/ckpt" --task "$tmp/task.jsonl" --tp 2 --pp 2 \
  --micro-batch 3 --per-item "$tmp/items2.jsonl" >"$tmp/t2.txt"
python3 - "$tmp/items1.jsonl" "$tmp/items2.jsonl" "$tmp/t1.txt" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 60, (len(a), len(b))
for x, y in zip(a, b):
    assert x["context_tokens"] == y["context_tokens"] and x["answer"] == y["answer"]
    for c, d in zip(x["continuations"], y["continuations"]):
        assert c["tokens"] == d["tokens"] and c["tokens"], (c, d)
        assert abs(c["loglikelihood"] - d["loglikelihood"]) < 1e-4, (c, d)
        assert c["loglikelihood"] < 0
    assert x["predicted"] == max(range(len(x["continuations"])),
                                 key=lambda i: x["continuations"][i]["loglikelihood"])
summary = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])["task"]
right = sum(x["predicted"] == x["answer"] for x in a) / len(a)
assert abs(summary["accuracy"] - right) < 1e-12 and summary["items"] == 60, summary
print(f"task: 60 items, acc {summary['accuracy']:.3f}, acc_norm {summary['accuracy_norm']:.3f}")
PY

# Mistakes: one line, exit 2.
source tests/support/expect_error.sh
expect_error no_input "give --data PREFIX" "$jumbo" eval --checkpoint "$tmp/ckpt"
expect_error bad_stride "--stride 40: expected 1 .. 32" "$jumbo" eval --checkpoint "$tmp/ckpt" --data "$tmp/data" --stride 40
expect_error no_checkpoint "no such checkpoint directory" "$jumbo" eval --checkpoint "$tmp/nowhere" --data "$tmp/data"
echo '{"context": "a", "continuations": [" b"], "answer": 3}' >"$tmp/bad.jsonl"
expect_error bad_answer 'bad.jsonl:1: "answer": 3 is not an index' "$jumbo" eval --checkpoint "$tmp/ckpt" \
  --task "$tmp/bad.jsonl"
expect_error bad_layout "--tp 3" "$jumbo" eval --checkpoint "$tmp/ckpt" --data "$tmp/data" --tp 3
finish
