#!/usr/bin/env bash
# `jumbo train` with no --config runs the embedded demo from any directory: its paths resolve
# against the checkout jumbo was built from. Without the demo's data it says in one line how
# to make them. Usage: demo_any_directory.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
abort_on_error
stop_at_first_failure
source tests/support/small_run.sh
make_small_data "$jumbo" "$tmp"

cd "$tmp"  # not a checkout: no inputs/ here
# One step of the demo model (its preset found in the checkout) on the small data.
"$jumbo" train --set train.steps=1 --set train.eval_every=0 --set "data.train=$tmp/data" \
  --set data.valid= --set "data.tokenizer=$tmp/tok.model" \
  --set log.metrics_file= --set log.peak_tflops=1 >"$tmp/out" 2>&1 ||
  { cat "$tmp/out"; fail "the demo does not run from $tmp"; }
grep -q "model demo-small" "$tmp/out" || { cat "$tmp/out"; fail "not the demo's model"; }
grep -q "^done: 1 steps" "$tmp/out" || { cat "$tmp/out"; fail "no 'done' line"; }
echo "ok: the embedded demo runs from $tmp"

# Its data missing: exit 2 and one line naming the file and scripts/demo.sh.
status=0
"$jumbo" train --set "data.tokenizer=$tmp/none.model" >"$tmp/out" 2>"$tmp/err" || status=$?
[[ $status -eq 2 && $(wc -l <"$tmp/err") -eq 1 ]] || { cat "$tmp/err"; fail "status $status"; }
grep -q "none.model" "$tmp/err" && grep -q "scripts/demo.sh" "$tmp/err" ||
  { cat "$tmp/err"; fail "the line does not say how to make the data"; }
echo "ok: $(cat "$tmp/err")"
finish
