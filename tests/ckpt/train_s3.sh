#!/usr/bin/env bash
# Checkpoints in S3 (s3rver on loopback): a 4-rank run (tp 2 x dp 2, ZeRO-1) saves to
# s3://jumbo-ckpt/runs/a at step 4 and stops; a run resumed with resume = "auto" from the
# bucket repeats the uninterrupted run's steps 5-8 bit for bit. Usage: train_s3.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
source tests/support/small_run.sh
source tests/support/s3rver.sh
on_exit stop_s3rver
check "making the small data set" make_small_data "$jumbo" "$tmp"
check "starting s3rver" start_s3rver "$tmp/s3" jumbo-ckpt

train() {
  train_small "$jumbo" 4 "$tmp" --set parallel.tp=2 --set parallel.zero1=true \
    --set train.global_batch=8 --set train.decay_tokens=8192 --set log.every=1 "$@"
}
url=s3://jumbo-ckpt/runs/a
train --set train.steps=8 --set "log.metrics_file=$tmp/full.jsonl" >"$tmp/full.log" 2>&1 ||
  { cat "$tmp/full.log"; fail "uninterrupted run"; }
train --set train.steps=4 --set "checkpoint.dir=$url" --set checkpoint.every=4 \
  --set "checkpoint.s3_endpoint=$S3_ENDPOINT" --set checkpoint.async=true \
  >"$tmp/save.log" 2>&1 || { cat "$tmp/save.log"; fail "saving to S3"; }
grep "checkpoint:" "$tmp/save.log"
ls "$tmp/s3/data/jumbo-ckpt/runs/a/step_00000004" | head -3 >/dev/null ||
  fail "nothing under the bucket"
train --set train.steps=8 --set "checkpoint.dir=$url" --set checkpoint.resume=auto \
  --set "checkpoint.s3_endpoint=$S3_ENDPOINT" --set "log.metrics_file=$tmp/resumed.jsonl" \
  >"$tmp/resumed.log" 2>&1 || { cat "$tmp/resumed.log"; fail "resuming from S3"; }
grep "checkpoint:" "$tmp/resumed.log"
grep -q "resumed from $url/step_00000004 (step 4" "$tmp/resumed.log" ||
  fail "did not resume from $url/step_00000004"
grep -q "S3RVER" "$tmp/save.log" "$tmp/resumed.log" && fail "a credential was printed"
want=$(losses "$tmp/full.jsonl" | tail -4)
got=$(losses "$tmp/resumed.jsonl")
[[ $want == "$got" ]] || { paste <(echo "$want") <(echo "$got"); fail "steps 5-8 differ"; }
finish "saved to and resumed from $url; steps 5-8 identical"
