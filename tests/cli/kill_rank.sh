#!/usr/bin/env bash
# A rank killed mid-step (SIGKILL) ends the whole job within 60 s, non-zero, with a message
# naming the rank. Usage: kill_rank.sh JUMBO REPO
set -uo pipefail
jumbo=$1
repo=$2
tmp=$(mktemp -d)
cleanup() {
  [[ -n ${job:-} ]] && kill -9 "$job" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
cd "$repo"
source tests/support/small_run.sh
make_small_data "$jumbo" "$tmp" || exit 1

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
grep -q "^step" "$tmp/log" || { echo "FAIL: training did not start"; cat "$tmp/log"; exit 1; }
victim=$(pgrep -P "$job" | sort -n | tail -1)
[[ -n $victim ]] || { echo "FAIL: no rank process under mpirun $job"; exit 1; }
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
[[ -n $status ]] || { echo "FAIL: job still running 60 s after the kill"; exit 1; }
[[ $status -ne 0 ]] || { echo "FAIL: job exited 0 after a rank was killed"; exit 1; }
grep -qiE "rank [0-9]+.*(signal 9|killed)|signal 9 \(Killed\)" "$tmp/log" ||
  { echo "FAIL: no message naming the killed rank"; exit 1; }
echo "ok: job ended ${elapsed}s after the kill, status $status"
