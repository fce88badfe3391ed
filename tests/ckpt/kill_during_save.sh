#!/usr/bin/env bash
# A job killed (SIGKILL to one rank) while its step-8 checkpoint is being written loses
# nothing beyond the step-4 checkpoint: the incomplete directory is skipped, resume = "auto"
# continues from step 4, and steps 5-8 repeat the uninterrupted run's losses bit for bit.
# Usage: kill_during_save.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
on_exit 'kill_tree "${job:-}"'  # the background subshell and mpirun, its child
source tests/support/small_run.sh
check "making the small data set" make_small_data "$jumbo" "$tmp"

# 4 ranks: tp 2 x dp 2 with ZeRO-1, so every rank writes a shard.
train() {
  train_small "$jumbo" 4 "$tmp" --set parallel.tp=2 --set parallel.zero1=true \
    --set train.steps=8 --set train.global_batch=8 --set log.every=1 "$@"
}

train --set "log.metrics_file=$tmp/full.jsonl" >"$tmp/full.log" 2>&1 ||
  { cat "$tmp/full.log"; fail "uninterrupted run"; }

ck=$tmp/ck
JUMBO_TEST_CKPT_STALL=8:120 train --set "checkpoint.dir=$ck" --set checkpoint.every=4 \
  --set checkpoint.async=true --set "log.metrics_file=$tmp/first.jsonl" >"$tmp/first.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do  # up to 60 s until the step-8 shards are being written
  compgen -G "$ck/step_00000008/*.h5" >/dev/null && break
  sleep 0.1
done
compgen -G "$ck/step_00000008/*.h5" >/dev/null ||
  { cat "$tmp/first.log"; fail "the step-8 save never started"; }
victim=$(rank_pids "$job" | sort -n | tail -1)
[[ -n $victim && $(ps -o comm= -p "$victim") == jumbo ]] ||
  fail "no jumbo rank process under the job $job"
kill -9 "$victim"
for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
kill -0 "$job" 2>/dev/null && fail "job still running 30 s after the kill"
wait "$job"
status=$?
job=
[[ $status -ne 0 ]] || fail "killed job exited 0"
[[ -f $ck/step_00000004/manifest.json ]] || fail "step-4 checkpoint incomplete"
[[ ! -f $ck/step_00000008/manifest.json ]] || fail "step 8 has a manifest"
[[ $(cat "$ck/latest") == step_00000004 ]] || fail "latest is $(cat "$ck/latest")"

train --set "checkpoint.dir=$ck" --set checkpoint.every=4 --set checkpoint.resume=auto \
  --set "log.metrics_file=$tmp/resumed.jsonl" >"$tmp/resumed.log" 2>&1 ||
  { cat "$tmp/resumed.log"; fail "resumed run"; }
grep "checkpoint:" "$tmp/resumed.log"
grep -q "skipping $ck/step_00000008: .*no manifest" "$tmp/resumed.log" ||
  fail "the incomplete step-8 directory was not reported"
grep -q "resumed from $ck/step_00000004 (step 4" "$tmp/resumed.log" ||
  fail "did not resume from step 4"
want=$(losses "$tmp/full.jsonl" | tail -4)
got=$(losses "$tmp/resumed.jsonl")
if [[ $want != "$got" ]]; then
  paste <(echo "$want") <(echo "$got")
  fail "steps 5-8 differ from the uninterrupted run"
fi
[[ -f $ck/step_00000008/manifest.json ]] || fail "step 8 not saved after resume"
finish "killed during the step-8 save (status $status); resumed from step 4; steps 5-8 identical"
