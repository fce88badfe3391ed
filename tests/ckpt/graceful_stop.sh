#!/usr/bin/env bash
# Graceful stop without Slurm: a signal to mpirun (forwarded to every rank) or SIGTERM to a
# single rank stops all ranks after the same step; they save a checkpoint and exit 75. The
# resumed run finishes with the uninterrupted run's losses bit for bit.
# Usage: graceful_stop.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
on_exit 'kill_tree "${job:-}"'
source tests/support/small_run.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
steps=300

# 4 ranks: tp 2 x pp 2, so the stop must agree across a pipeline and a tensor group.
train() {
  train_small "$jumbo" 4 "$tmp" --set parallel.tp=2 --set parallel.pp=2 \
    --set train.steps=$steps --set train.global_batch=8 --set log.every=1000 "$@"
}
train --set "log.metrics_file=$tmp/full.jsonl" >"$tmp/full.log" 2>&1 ||
  { cat "$tmp/full.log"; fail "uninterrupted run"; finish; }

# stop_case NAME SIGNAL TARGET: TARGET is "mpirun" or "rank" (the highest-numbered rank).
stop_case() {
  local name=$1 signal=$2 target=$3 ck=$tmp/ck-$1 metrics=$tmp/$1.jsonl
  train --set "checkpoint.dir=$ck" --set checkpoint.every=1000 --set checkpoint.resume=auto \
    --set "log.metrics_file=$metrics" >"$tmp/$name-first.log" 2>&1 &
  job=$!
  for _ in $(seq 1 600); do  # until step 20 is done (up to 60 s)
    [[ -f $metrics && $(wc -l <"$metrics") -ge 20 ]] && break
    sleep 0.1
  done
  local pid
  if [[ $target == mpirun ]]; then
    pid=$(pgrep -x mpirun -P "$job")
  else
    pid=$(rank_pids "$job" | sort -n | tail -1)
  fi
  [[ -n $pid ]] || { fail "$name: no process to signal"; return 1; }
  kill "-$signal" "$pid"
  wait "$job"
  local status=$?
  job=
  local stopped
  stopped=$(sed -n 's/^stopping after step \([0-9]*\) of.*/\1/p' "$tmp/$name-first.log")
  if [[ $status -ne 75 || -z $stopped || ! -f $ck/step_$(printf %08d "$stopped")/manifest.json ]]; then
    cat "$tmp/$name-first.log"
    fail "$name: status $status (expected 75), stopped after '${stopped}', checkpoint?"
    return 1
  fi
  ((stopped < steps)) || { fail "$name: the run ended before the signal"; return 1; }
  train --set "checkpoint.dir=$ck" --set checkpoint.every=1000 --set checkpoint.resume=auto \
    --set "log.metrics_file=$metrics" >"$tmp/$name-second.log" 2>&1 ||
    { cat "$tmp/$name-second.log"; fail "$name: resumed run"; return 1; }
  grep -q "checkpoint: resumed from .*step_$(printf %08d "$stopped") (step $stopped" "$tmp/$name-second.log" ||
    { cat "$tmp/$name-second.log"; fail "$name: did not resume from step $stopped"; return 1; }
  # The metrics file has steps 1..stopped, then stopped+1..steps: together the full run.
  if ! diff <(losses "$tmp/full.jsonl") <(losses "$metrics") >"$tmp/$name.diff"; then
    head "$tmp/$name.diff"
    fail "$name: losses differ from the uninterrupted run"
    return 1
  fi
  echo "ok   $name: stopped after step $stopped with exit 75, resumed, all $steps losses identical"
}

stop_case usr1-to-mpirun USR1 mpirun
stop_case term-to-one-rank TERM rank
finish
