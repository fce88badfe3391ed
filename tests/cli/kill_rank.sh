#!/usr/bin/env bash
# A rank killed mid-step (SIGKILL) ends the whole job within 60 s, non-zero, with a message
# naming the rank. Usage: kill_rank.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
on_exit 'kill_tree "${job:-}"'
source tests/support/small_run.sh
check "making the small data set" make_small_data "$jumbo" "$tmp"

OMP_NUM_THREADS=1 mpirun -np 4 --oversubscribe "$jumbo" train \
  --set model.preset=inputs/models/tiny.toml --set parallel.tp=2 --set parallel.pp=2 \
  --set train.steps=1000000 --set train.global_batch=8 --set parallel.micro_batch=1 \
  --set train.eval_every=0 --set "data.train=$tmp/data" --set data.valid= \
  --set "data.tokenizer=$tmp/tok.model" --set log.metrics_file= --set log.every=1 \
  --set log.peak_tflops=1 >"$tmp/log" 2>&1 &
job=$!

for _ in $(seq 1 300); do  # up to 30 s for training to start
  grep -q "^step" "$tmp/log" && break
  sleep 0.1
done
grep -q "^step" "$tmp/log" || { cat "$tmp/log"; fail "training did not start"; }
victim=$(pgrep -P "$job" | sort -n | tail -1)
[[ -n $victim ]] || fail "no rank process under mpirun $job"
kill -9 "$victim"
killed=$(date +%s)

status=
for _ in $(seq 1 600); do  # 60 s
  if ! kill -0 "$job" 2>/dev/null; then
    wait "$job"
    status=$?
    break
  fi
  sleep 0.1
done
elapsed=$(($(date +%s) - killed))
job=
tail -15 "$tmp/log"
[[ -n $status ]] || fail "job still running 60 s after the kill"
[[ $status -ne 0 ]] || fail "job exited 0 after a rank was killed"
grep -qiE "rank [0-9]+.*(signal 9|killed)|signal 9 \(Killed\)" "$tmp/log" ||
  fail "no message naming the killed rank"
finish "job ended ${elapsed}s after the kill, status $status"
