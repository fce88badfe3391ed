#!/usr/bin/env bash
# `jumbo plot`: a metrics file (two runs appended, eval steps, a diverged step) becomes an SVG
# that parses as XML with one loss point per finite step; bad input is exit 2 and one line.
# Usage: plot.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"

# 300 steps, then a resume from step 250 that runs to 320; step 40 has a null (NaN) loss.
python3 - "$tmp/metrics.jsonl" <<'PY'
import json, math, sys
with open(sys.argv[1], "w") as f:
    def line(step, run):
        lr = 6e-4 * min(1, step / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / 320)))
        row = {"step": step, "total_steps": 320, "loss": 2.5 + 8 * math.exp(-step / 40) + 0.02 * run,
               "lr": lr, "grad_norm": 1.0, "global_batch": 32, "tokens": step * 32 * 1024}
        if step == 40:
            row["loss"] = None
        if step % 50 == 0:
            row["val_loss"] = row["loss"] + 0.1
        f.write(json.dumps(row, separators=(",", ":")) + "\n")
    for s in range(1, 301):
        line(s, 0)
    for s in range(251, 321):
        line(s, 1)
PY

"$jumbo" plot "$tmp/metrics.jsonl" -o "$tmp/loss.svg" --title "demo & co" >"$tmp/out" 2>"$tmp/err"
status=$?
[[ $status -eq 0 ]] || fail "plot exited $status: $(cat "$tmp/err")"
grep -q "1 step(s) with a non-finite loss" "$tmp/err" || fail "no note about the NaN step: $(cat "$tmp/err")"
grep -q "320 steps from 370 lines (50 repeated steps" "$tmp/out" || fail "summary: $(cat "$tmp/out")"
python3 - "$tmp/loss.svg" <<'PY' || fail "SVG check"
import sys, xml.etree.ElementTree as E
root = E.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert root.tag == ns + "svg", root.tag
lines = {p.get("id"): p.get("points").split() for p in root.iter(ns + "polyline")}
assert len(lines["loss"]) == 319, len(lines["loss"])      # 320 steps, one NaN
assert len(lines["val_loss"]) == 6, len(lines["val_loss"])  # steps 50..300
assert len(lines["lr"]) == 320, len(lines["lr"])
texts = [t.text for t in root.iter(ns + "text")]
for want in ("demo & co", "tokens", "loss (nats/token)", "learning rate", "train loss", "val loss", "10M"):
    assert want in texts, (want, texts)
print("svg ok:", {k: len(v) for k, v in lines.items()})
PY

# expect_error NAME PATTERN -- ARGS: exit 2, one stderr line containing PATTERN.
expect_error() {
  local name=$1 pattern=$2
  shift 3
  "$jumbo" "$@" >"$tmp/out" 2>"$tmp/err"
  local status=$? lines
  lines=$(wc -l <"$tmp/err")
  if [[ $status -eq 2 && $lines -eq 1 ]] && grep -qF -- "$pattern" "$tmp/err"; then
    echo "ok   $name: $(cat "$tmp/err")"
  else
    fail "$name: status $status, $lines stderr lines: $(cat "$tmp/err")"
  fi
}
head -3 "$tmp/metrics.jsonl" >"$tmp/bad.jsonl"
echo '{"step": 4, "loss": 2.0, "tokens"' >>"$tmp/bad.jsonl"
expect_error bad-line "$tmp/bad.jsonl:4: not a JSON object" -- plot "$tmp/bad.jsonl" -o "$tmp/x.svg"
expect_error missing-file "$tmp/none.jsonl: no such file" -- plot "$tmp/none.jsonl" -o "$tmp/x.svg"
: >"$tmp/empty.jsonl"
expect_error empty-file "$tmp/empty.jsonl: empty" -- plot "$tmp/empty.jsonl" -o "$tmp/x.svg"
echo '{"step":1,"tokens":10}' >"$tmp/noloss.jsonl"
expect_error no-loss "$tmp/noloss.jsonl:1: no \"loss\" field" -- plot "$tmp/noloss.jsonl" -o "$tmp/x.svg"
[[ ! -e $tmp/x.svg ]] || fail "an SVG was written for bad input"

finish
