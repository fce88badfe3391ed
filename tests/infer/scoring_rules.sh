#!/usr/bin/env bash
# jumbo eval --task --scoring whole|boundary on a tiny trained checkpoint. Checked with a
# decoder of our own (the tokenizer's .vocab: piece per id, "▁" a space, <0xHH> a byte):
#   whole     the default, lm-evaluation-harness's split: the context's tokens and the scored
#             ones are the pair encoded whole, cut after the context's own token count;
#   boundary  the context's tokens are its own (the boundary rule's, EOS first) and the scored
#             tokens decode to exactly the continuation;
# the counts line (eval and inspect-tokenizer --task) agrees with what the two rules' tokens
# show, both layouts give the same log-likelihoods, and a bad --scoring is one line, exit 2.
source "$(dirname "$0")/../support/harness.sh" "$@"
abort_on_error
stop_at_first_failure
source tests/support/small_run.sh
make_small_data "$jumbo" "$tmp"
train_small "$jumbo" 1 "$tmp" --set train.steps=10 --set train.global_batch=8 \
  --set checkpoint.dir="$tmp/ckpt" --set checkpoint.every=10 >/dev/null

# The shipped task's first 40 items, and pairs whose seam a multi-word piece ("▁of▁the")
# may cross, or a piece boundary (a newline, a byte piece) always ends.
head -40 inputs/tasks/brown-lastword.jsonl >"$tmp/task.jsonl"
python3 - "$tmp/task.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "a") as f:
    for ctx in ["He was one of", "The bread and", "He waited for", "They were in", "Genre:",
                "line one\n", "It is not  "]:
        f.write(json.dumps({"context": ctx, "continuations": [" the", " a", " his", "ing", " ½"],
                            "answer": 0}) + "\n")
PY
run_eval() {  # run_eval NAME [FLAGS...]: the table and JSON in NAME.txt, items in NAME.jsonl
  local name=$1
  shift
  "$jumbo" eval --checkpoint "$tmp/ckpt" --task "$tmp/task.jsonl" --per-item "$tmp/$name.jsonl" \
    "$@" >"$tmp/$name.txt"
}
run_eval default
run_eval whole --scoring whole
run_eval boundary --scoring boundary
mpirun -np 2 "$jumbo" eval --checkpoint "$tmp/ckpt" --task "$tmp/task.jsonl" --pp 2 \
  --scoring boundary --per-item "$tmp/boundary-pp2.jsonl" >"$tmp/boundary-pp2.txt"
"$jumbo" data inspect-tokenizer "$tmp/tok.model" --task "$tmp/task.jsonl" >"$tmp/inspect.txt"
cmp -s "$tmp/default.jsonl" "$tmp/whole.jsonl" || fail "--scoring whole is not the default"
grep -q "^task .*acc_norm *scoring$" "$tmp/boundary.txt" || { cat "$tmp/boundary.txt"; fail "no scoring column"; }

python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
pieces = [l.split("\t")[0] for l in open(f"{tmp}/tok.vocab", encoding="utf-8")]
def decode(ids):  # mid-document: every "▁" is a space (no first one dropped)
    out = b""
    for i in ids:
        p = pieces[i]
        if p in ("<unk>", "<s>", "</s>"):
            continue
        if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            out += bytes([int(p[3:5], 16)])
        else:
            out += p.replace("\u2581", " ").encode()
    return out.decode("utf-8", "replace")
eos = pieces.index("</s>")
items = [json.loads(l) for l in open(f"{tmp}/task.jsonl")]
def load(name):
    lines = open(f"{tmp}/{name}.txt").read().strip().splitlines()
    return [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")], json.loads(lines[-1])["task"], lines
whole, wsum, wlines = load("whole")
bound, bsum, blines = load("boundary")
assert len(whole) == len(bound) == len(items)
merged = changed = cut_inside = pairs = 0
for item, w, b in zip(items, whole, bound):
    ctx = item["context"]
    for c, wc, bc in zip(item["continuations"], w["continuations"], b["continuations"]):
        pairs += 1
        # boundary: the context's own tokens, then exactly the continuation's.
        own = bc["context_tokens"]
        assert own == b["context_tokens"] and own[0] == eos, (ctx, c)
        assert decode(own[1:]) == " " + ctx, (decode(own[1:]), ctx)
        assert decode(bc["tokens"]) == c and bc["text"] == c, (bc, c)
        # whole: the pair encoded whole, cut after the context's own token count.
        all_ = wc["context_tokens"] + wc["tokens"]
        assert all_[0] == eos and decode(all_[1:]) == " " + ctx + c, (ctx, c)
        assert len(wc["context_tokens"]) == min(len(own), len(all_) - 1), (ctx, c)
        head = decode(wc["context_tokens"][1:])
        assert wc["text"] == decode(all_[1:])[len(head):], (wc, c)
        if len(head) > len(ctx) + 1 and head.startswith(" " + ctx):
            merged += 1
            assert wc["text"] != c
        elif wc["context_tokens"] != own:
            changed += 1
            cut_inside += head != " " + ctx
        else:
            assert wc["tokens"] == bc["tokens"] and wc["text"] == c, (wc, bc)
for s in (wsum, bsum):
    assert (s["pairs"], s["merged"], s["changed"]) == (pairs, merged, changed), (s, pairs, merged, changed)
assert wsum["scoring"] == "whole" and bsum["scoring"] == "boundary"
assert merged + changed > 0, "no pair crosses the seam: the test shows nothing"
line = (f"task: {pairs} pairs, {merged} merge the continuation into the context's last piece, "
        f"{changed} more change the context's tokens ({cut_inside} of them cut inside the "
        "context); whole rule")
for lines in (wlines, blines):
    assert line in lines, (line, lines)
inspect = open(f"{tmp}/inspect.txt").read().strip().splitlines()[-1]
assert inspect == f"task {tmp}/task.jsonl: " + line[len("task: "):], inspect
# Each rule's accuracies are its own log-likelihoods' picks; pp 2 gives the same numbers.
for rows, s in ((whole, wsum), (bound, bsum)):
    for r in rows:
        ll = [c["loglikelihood"] for c in r["continuations"]]
        assert r["predicted"] == max(range(len(ll)), key=lambda i: ll[i]) and max(ll) < 0
    acc = sum(r["predicted"] == r["answer"] for r in rows) / len(rows)
    acc_norm = sum(r["predicted_norm"] == r["answer"] for r in rows) / len(rows)
    assert abs(s["accuracy"] - acc) < 1e-12 and abs(s["accuracy_norm"] - acc_norm) < 1e-12, s
pp2 = [json.loads(l) for l in open(f"{tmp}/boundary-pp2.jsonl")]
for a, b in zip(bound, pp2):
    for c, d in zip(a["continuations"], b["continuations"]):
        assert c["tokens"] == d["tokens"] and abs(c["loglikelihood"] - d["loglikelihood"]) < 1e-4
print(line)
print(f"whole: acc {wsum['accuracy']:.3f} acc_norm {wsum['accuracy_norm']:.3f}; "
      f"boundary: acc {bsum['accuracy']:.3f} acc_norm {bsum['accuracy_norm']:.3f}")
PY

source tests/support/expect_error.sh
expect_error bad_scoring "--scoring wholly: expected whole or boundary" "$jumbo" eval \
  --checkpoint "$tmp/ckpt" --task "$tmp/task.jsonl" --scoring wholly
finish
