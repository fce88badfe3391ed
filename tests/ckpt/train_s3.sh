#!/usr/bin/env bash
# Checkpoints in S3 (s3rver on loopback): a 4-rank run (tp 2 x dp 2, ZeRO-1) saves to
# s3://jumbo-ckpt/runs/a at step 4 and stops; a run resumed with resume = "auto" from the
# bucket repeats the uninterrupted run's steps 5-8 bit for bit. Usage: train_s3.sh JUMBO REPO
set -uo pipefail
jumbo=$1
repo=$2
tmp=$(mktemp -d)
cd "$repo"
source tests/support/small_run.sh
source tests/support/s3rver.sh
trap 'stop_s3rver; rm -rf "$tmp"' EXIT
make_small_data "$jumbo" "$tmp" || exit 1
start_s3rver "$tmp/s3" jumbo-ckpt || exit 1

train() {
  train_small "$jumbo" 4 "$tmp" --set parallel.tp=2 --set parallel.zero1=true \
    --set train.global_batch=8 --set train.decay_tokens=8192 --set log.every=1 "$@"
}
url=s3://jumbo-ckpt/runs/a
train --set train.steps=8 --set "log.metrics_file=$tmp/full.jsonl" >"$tmp/full.log" 2>&1 ||
  { cat "$tmp/full.log"; echo "FAIL: uninterrupted run"; exit 1; }
train --set train.steps=4 --set "checkpoint.dir=$url" --set checkpoint.every=4 \
  --set "checkpoint.s3_endpoint=$S3_ENDPOINT" --set checkpoint.async=true \
  >"$tmp/save.log" 2>&1 || { cat "$tmp/save.log"; echo "FAIL: saving to S3"; exit 1; }
grep "checkpoint:" "$tmp/save.log"
ls "$tmp/s3/data/jumbo-ckpt/runs/a/step_00000004" | head -3 >/dev/null ||
  { echo "FAIL: nothing under the bucket"; exit 1; }
train --set train.steps=8 --set "checkpoint.dir=$url" --set checkpoint.resume=auto \
  --set "checkpoint.s3_endpoint=$S3_ENDPOINT" --set "log.metrics_file=$tmp/resumed.jsonl" \
  >"$tmp/resumed.log" 2>&1 || { cat "$tmp/resumed.log"; echo "FAIL: resuming from S3"; exit 1; }
grep "checkpoint:" "$tmp/resumed.log"
grep -q "resumed from $url/step_00000004 (step 4" "$tmp/resumed.log" ||
  { echo "FAIL: did not resume from $url/step_00000004"; exit 1; }
grep -q "S3RVER" "$tmp/save.log" "$tmp/resumed.log" && { echo "FAIL: a credential was printed"; exit 1; }
want=$(losses "$tmp/full.jsonl" | tail -4)
got=$(losses "$tmp/resumed.jsonl")
[[ $want == "$got" ]] || { echo "FAIL: steps 5-8 differ"; paste <(echo "$want") <(echo "$got"); exit 1; }
echo "ok: saved to and resumed from $url; steps 5-8 identical"
