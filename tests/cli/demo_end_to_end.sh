#!/usr/bin/env bash
# The README's demo command, end to end: scripts/demo.sh makes the tokenizer and datasets
# from the shipped Brown corpus and trains the embedded demo run; the validation loss must
# end at least 2.5 nats below ln(vocab) = ln(4096) = 8.318. Usage: demo_end_to_end.sh JUMBO REPO
set -euo pipefail
jumbo=$1
repo=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$repo"

start=$(date +%s)
JUMBO_BUILD_DIR=$(dirname "$jumbo") JUMBO_DEMO_DIR=$tmp bash scripts/demo.sh | tee "$tmp/log"
elapsed=$(($(date +%s) - start))

val=$(python3 -c '
import json, sys
vals = [json.loads(l).get("val_loss") for l in open(sys.argv[1])]
vals = [v for v in vals if v is not None]
print(vals[-1])' "$tmp/metrics.jsonl")
echo "demo: final validation loss $val after ${elapsed}s"
python3 -c '
import math, sys
val = float(sys.argv[1]); bound = math.log(4096) - 2.5
if val > bound:
    sys.exit(f"validation loss {val:.4f} is above ln(4096) - 2.5 = {bound:.4f}")
print(f"ok: {val:.4f} <= {bound:.4f}")' "$val"
