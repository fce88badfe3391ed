#!/usr/bin/env bash
# A job killed (SIGKILL to one rank) while its step-8 checkpoint is being written loses
# nothing beyond the step-4 checkpoint: the incomplete directory is skipped, resume = "auto"
# continues from step 4, and steps 5-8 repeat the uninterrupted run's losses bit for bit.
# Usage: kill_during_save.sh JUMBO REPO
set -uo pipefail
jumbo=$1
repo=$2
tmp=$(mktemp -d)
cleanup() {
  if [[ -n ${job:-} ]]; then
    pkill -9 -P "$job" 2>/dev/null  # mpirun, started by the background subshell
    kill -9 "$job" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
cd "$repo"
source tests/support/small_run.sh
make_small_data "$jumbo" "$tmp" || exit 1

# 4 ranks: tp 2 x dp 2 with ZeRO-1, so every rank writes a shard.
train() {
  train_small "$jumbo" 4 "$tmp" --set parallel.tp=2 --set parallel.zero1=true \
    --set train.steps=8 --set train.global_batch=8 --set log.every=1 "$@"
}

train --set "log.metrics_file=$tmp/full.jsonl" >"$tmp/full.log" 2>&1 ||
  { cat "$tmp/full.log"; echo "FAIL: uninterrupted run"; exit 1; }

ck=$tmp/ck
JUMBO_TEST_CKPT_STALL=8:120 train --set "checkpoint.dir=$ck" --set checkpoint.every=4 \
  --set checkpoint.async=true --set "log.metrics_file=$tmp/first.jsonl" >"$tmp/first.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do  # up to 60 s until the step-8 shards are being written
  compgen -G "$ck/step_00000008/*.h5" >/dev/null && break
  sleep 0.1
done
compgen -G "$ck/step_00000008/*.h5" >/dev/null ||
  { cat "$tmp/first.log"; echo "FAIL: the step-8 save never started"; exit 1; }
victim=$(rank_pids "$job" | sort -n | tail -1)
[[ -n $victim && $(ps -o comm= -p "$victim") == jumbo ]] ||
  { echo "FAIL: no jumbo rank process under the job $job"; exit 1; }
kill -9 "$victim"
for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
kill -0 "$job" 2>/dev/null && { echo "FAIL: job still running 30 s after the kill"; exit 1; }
wait "$job"
status=$?
job=
[[ $status -ne 0 ]] || { echo "FAIL: killed job exited 0"; exit 1; }
[[ -f $ck/step_00000004/manifest.json ]] || { echo "FAIL: step-4 checkpoint incomplete"; exit 1; }
[[ ! -f $ck/step_00000008/manifest.json ]] || { echo "FAIL: step 8 has a manifest"; exit 1; }
[[ $(cat "$ck/latest") == step_00000004 ]] || { echo "FAIL: latest is $(cat "$ck/latest")"; exit 1; }

train --set "checkpoint.dir=$ck" --set checkpoint.every=4 --set checkpoint.resume=auto \
  --set "log.metrics_file=$tmp/resumed.jsonl" >"$tmp/resumed.log" 2>&1 ||
  { cat "$tmp/resumed.log"; echo "FAIL: resumed run"; exit 1; }
grep "checkpoint:" "$tmp/resumed.log"
grep -q "skipping $ck/step_00000008: .*no manifest" "$tmp/resumed.log" ||
  { echo "FAIL: the incomplete step-8 directory was not reported"; exit 1; }
grep -q "resumed from $ck/step_00000004 (step 4" "$tmp/resumed.log" ||
  { echo "FAIL: did not resume from step 4"; exit 1; }
want=$(losses "$tmp/full.jsonl" | tail -4)
got=$(losses "$tmp/resumed.jsonl")
if [[ $want != "$got" ]]; then
  echo "FAIL: steps 5-8 differ from the uninterrupted run"
  paste <(echo "$want") <(echo "$got")
  exit 1
fi
[[ -f $ck/step_00000008/manifest.json ]] || { echo "FAIL: step 8 not saved after resume"; exit 1; }
echo "ok: killed during the step-8 save (status $status); resumed from step 4; steps 5-8 identical"
