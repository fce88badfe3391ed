#!/usr/bin/env bash
# slurm/sweep.sh on a one-node Slurm cluster started here: a grid of three learning rates
# (one grid line, comma syntax) becomes a 3-task job array of the tiny model on 2 ranks
# each (dp 2), all three at once; the summary job (afterany on the array) writes a table
# with one row per task, numeric losses, sorted by validation loss. Submitted by the
# harness's unprivileged job user (tests/support/slurm_cluster.sh), as on ParallelCluster.
# Usage: sweep.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
source tests/support/small_run.sh
source tests/support/slurm_cluster.sh
on_exit stop_slurm
# What a failure shows before the cleanup: the logs it needs.
failure_logs() {
  local f
  for f in "$tmp"/sweep/logs/*.out; do [[ -f $f ]] && { echo "== $f"; tail -30 "$f"; }; done
}
on_failure failure_logs

mkdir -p "$tmp/data"
make_small_data "$jumbo" "$tmp/data" || fail "could not make the small dataset"
cat >"$tmp/run.toml" <<EOF
[model]
preset = "inputs/models/tiny.toml"
[parallel]
micro_batch = 1
[train]
steps = 8
global_batch = 8
warmup_tokens = 0
eval_every = 4
eval_batches = 2
[data]
train = "$tmp/data/data"
valid = "$tmp/data/data"
tokenizer = "$tmp/data/tok.model"
[log]
every = 4
peak_tflops = 1
EOF
cat >"$tmp/grid.txt" <<EOF
# three learning rates
train.lr=1e-3,3e-3,1e-2
EOF

start_slurm "$tmp/slurm" || fail "could not start Slurm"
job_user_test_dirs "$tmp" "$repo" "$jumbo" && job_user_dirs "$tmp/sweep" ||
  fail "the job user cannot use this checkout"
# Not root: Open MPI's permission to run as root is withdrawn, so a job that did would fail.
unset JUMBO_HOME JUMBO_RUN_DIR JUMBO_CKPT_DIR JUMBO_RUN_NAME JUMBO_LAUNCHER JUMBO_SWEEP_PARALLEL \
  OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
export JUMBO=$jumbo JUMBO_CONFIG=$tmp/run.toml JUMBO_ROOT=$tmp/fsx JUMBO_SWEEP_DIR=$tmp/sweep \
  JUMBO_EXPECT_EFA=0 JUMBO_LAYOUT_FROM_PLAN=0 JUMBO_DOCTOR=${JUMBO_DOCTOR:-1} OMP_NUM_THREADS=1
t0=$SECONDS
out=$(as_job_user slurm/sweep.sh submit "$tmp/grid.txt" --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
  --gpus-per-node=0 --time=30 -- --set train.seed=7) || { echo "$out"; fail "sweep submit"; }
echo "$out"
last=$(tail -1 <<<"$out")
[[ $last =~ ^sweep_dir=([^ ]+)\ array_job=([0-9]+)\ summary_job=([0-9]+)$ ]] ||
  fail "unexpected last line of sweep submit: $last"
dir=${BASH_REMATCH[1]} array=${BASH_REMATCH[2]} summary=${BASH_REMATCH[3]}
[[ $dir == "$tmp/sweep" ]] || fail "sweep dir $dir, expected $tmp/sweep"
[[ $(job_field "$summary" Dependency) == "afterany:${array}_*"* ]] ||
  fail "summary job dependency is '$(job_field "$summary" Dependency)'"
wait_job "$summary" COMPLETED 150 || fail "summary job $summary"
for i in 0 1 2; do
  [[ $(job_field "${array}_$i" JobState) == COMPLETED ]] ||
    fail "task $i is $(job_field "${array}_$i" JobState)"
done
echo "sweep took $((SECONDS - t0)) s"
cat "$dir/summary.txt"
cat "$dir"/logs/summary-*.out | diff -q - "$dir/summary.txt" >/dev/null ||
  fail "the summary job's log differs from summary.txt"

python3 - "$dir/summary.txt" <<'EOF' || fail "summary table"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines[0].endswith("3 of 3 tasks reported; sorted by val_loss"), lines[0]
rows = [l.split() for l in lines[2:]]
assert len(rows) == 3, rows
tasks, val = [], []
for r in rows:
    rank, task, code, steps, loss, vloss, rate, override = r
    assert code == "0" and steps == "8", r
    float(loss), float(rate)
    val.append(float(vloss))
    tasks.append(task)
    assert re.fullmatch(r"train\.lr=(1e-3|3e-3|1e-2)", override), r
assert sorted(tasks) == ["0", "1", "2"], tasks
assert val == sorted(val), val
print("ok: 3 rows, numeric losses, sorted by val_loss:", val)
EOF
# Each task: its own checkpoints-free run dir and metrics, the common argument applied.
for i in 0 1 2; do
  [[ $(wc -l <"$dir/task-$i/metrics.jsonl") -eq 8 ]] || fail "task $i metrics lines"
  grep -q -- "--set train.seed=7 --set train.lr=" "$dir/logs/${array}_$i.out" ||
    fail "task $i: the common argument or the override is missing from the launch line"
done
echo "ok: sweep of 3 tasks in $((SECONDS - t0)) s"
finish
