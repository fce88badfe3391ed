#!/usr/bin/env bash
# slurm/train_jumbo.sh as a real batch job on a one-node Slurm cluster started here: the
# tiny model on 4 ranks (tp 2 x pp 2 from the script's arguments), no GPUs (the #SBATCH
# GPU and CPU requests are overridden on the sbatch command line), no EFA. The job ends
# COMPLETED with exit 0, its log shows the doctor, the launch and training, the metrics
# file has every step and the last checkpoint is complete. Then the same with
# JUMBO_LAUNCHER=mpirun (Open MPI's mpirun inside the allocation) and the layout from
# `jumbo plan --best` for 1 node x 4 ranks. Every job is submitted by the harness's
# unprivileged job user (tests/support/slurm_cluster.sh), as on ParallelCluster.
# Usage: train.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
source tests/support/small_run.sh
source tests/support/slurm_cluster.sh
on_exit stop_slurm
# What a failure shows before the cleanup: the logs it needs.
failure_logs() {
  [[ -n ${log:-} && -f $log ]] && { echo "== $log"; tail -80 "$log"; }
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
steps = 12
global_batch = 8
eval_every = 6
eval_batches = 2
[data]
train = "$tmp/data/data"
valid = "$tmp/data/data"
tokenizer = "$tmp/data/tok.model"
[checkpoint]
every = 6
[log]
every = 1
peak_tflops = 1
EOF

# One job below is requeued once: cred_expire 10 s, not ParallelCluster's 70 (the BeginTime wait).
SLURM_TEST_CRED_EXPIRE=10 start_slurm "$tmp/slurm" || fail "could not start Slurm"
job_user_test_dirs "$tmp" "$repo" "$jumbo" || fail "the job user cannot use this checkout"
# Not root: Open MPI's permission to run as root is withdrawn, so a job that did would fail.
unset JUMBO_HOME JUMBO_RUN_DIR JUMBO_CKPT_DIR JUMBO_RUN_NAME JUMBO_LAUNCHER \
  OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
export JUMBO=$jumbo JUMBO_CONFIG=$tmp/run.toml JUMBO_ROOT=$tmp/fsx JUMBO_EXPECT_EFA=0 \
  JUMBO_DOCTOR=${JUMBO_DOCTOR:-1} OMP_NUM_THREADS=1
# The cluster's one node has CPUs=8 and no GPUs: 4 ranks of 1 CPU, --gpus-per-node=0
# replaces the script's --gpus-per-node=8 (Slurm 22.05 refused --gres=none and --gpus=0).
# --time=30 (minutes) stays clear of --signal=B:USR1@600, which would stop a 10-minute job
# at once.
sbatch_args=(--parsable --nodes=1 --ntasks-per-node=4 --cpus-per-task=1 --gpus-per-node=0
  --time=30 --output="$tmp/logs/%x-%j.out" --error="$tmp/logs/%x-%j.out")

# check_run LAUNCHER RUN_NAME LAYOUT_FROM_PLAN [ARGS...]: submit, wait, check everything.
check_run() {
  local launcher=$1 name=$2 from_plan=$3 id t0 steps ck tp=2 pp=2
  shift 3
  t0=$SECONDS
  id=$(JUMBO_LAUNCHER=$launcher JUMBO_RUN_NAME=$name JUMBO_LAYOUT_FROM_PLAN=$from_plan \
    as_job_user sbatch "${sbatch_args[@]}" slurm/train_jumbo.sh "$@") || fail "sbatch failed"
  log=$tmp/logs/j1-jumbo-$id.out
  wait_job "$id" COMPLETED 150 || fail "$launcher: job $id did not complete"
  [[ $(job_field "$id" ExitCode) == 0:0 ]] || fail "$launcher: exit code $(job_field "$id" ExitCode)"
  grep -q "jumbo-slurm: doctor: \(every node passed\|skipped\)" "$log" || fail "$launcher: no doctor line"
  grep -q "jumbo-slurm: launch: $launcher " "$log" || fail "$launcher: not launched with $launcher"
  if [[ $from_plan == 1 ]]; then
    # The planner's choice for 1 node x 4 ranks of the tiny model, whatever it is, is the
    # layout that trains.
    grep -q "^  plan: recommended: " "$log" || fail "$launcher: the plan is not in the log"
    tp=$(sed -n 's/.*jumbo-slurm: layout: jumbo plan chose .*parallel\.tp=\([0-9]*\).*/\1/p' "$log")
    pp=$(sed -n 's/.*jumbo-slurm: layout: jumbo plan chose .*parallel\.pp=\([0-9]*\).*/\1/p' "$log")
    [[ -n $tp && -n $pp ]] || fail "$launcher: no layout chosen by jumbo plan"
  fi
  grep -q "layout tp $tp x pp $pp x dp $((4 / (tp * pp))) on 4 ranks" "$log" ||
    fail "$launcher: not trained with tp $tp x pp $pp"
  grep -q "^step   12/12 " "$log" || fail "$launcher: no training lines in the log"
  grep -q "jumbo-slurm: not requeued because training finished" "$log" ||
    fail "$launcher: no final decision line"
  steps=$(python3 -c 'import json,sys
print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$tmp/fsx/runs/$name/metrics.jsonl")
  [[ $steps == "$(seq -s ' ' 1 12)" ]] || fail "$launcher: metrics steps are '$steps'"
  ck=$tmp/fsx/checkpoints/$name
  [[ -f $ck/step_00000012/manifest.json && $(cat "$ck/latest") == step_00000012 ]] ||
    fail "$launcher: no complete step-12 checkpoint in $ck"
  echo "ok: $launcher job $id COMPLETED in $((SECONDS - t0)) s; 12 steps in the metrics;" \
    "checkpoint $ck/step_00000012"
}

check_run srun run-srun 0 --set parallel.tp=2 --set parallel.pp=2
check_run mpirun run-mpirun 1
grep "jumbo-slurm:" "$log"

# The decisions that end a job FAILED, three jobs at once (2 ranks each): a mistake in the
# arguments (exit 2, never requeued); `jumbo train` failing every time (requeued
# JUMBO_MAX_FAILURES = 1 time, then not); a node failing `jumbo doctor` (exit 1, no requeue).
# The failures come from a stand-in binary that fails one verb and runs the real one else.
cat >"$tmp/fake-jumbo" <<EOF
#!/usr/bin/env bash
if [[ \$1 == \${FAKE_FAIL:-none} ]]; then echo "fake jumbo: \$1 fails"; exit \$FAKE_FAIL_CODE; fi
exec $jumbo "\$@"
EOF
chmod +x "$tmp/fake-jumbo"
t0=$SECONDS
sbatch_args=("${sbatch_args[@]/--ntasks-per-node=4/--ntasks-per-node=2}")
bad=$(JUMBO_RUN_NAME=bad as_job_user sbatch "${sbatch_args[@]}" slurm/train_jumbo.sh --set train.lrr=1) ||
  fail sbatch
fails=$(JUMBO=$tmp/fake-jumbo FAKE_FAIL=train FAKE_FAIL_CODE=3 JUMBO_MAX_FAILURES=1 JUMBO_RUN_NAME=fails \
  as_job_user sbatch "${sbatch_args[@]}" slurm/train_jumbo.sh) || fail sbatch
sick=$(JUMBO=$tmp/fake-jumbo FAKE_FAIL=doctor FAKE_FAIL_CODE=1 JUMBO_DOCTOR=1 JUMBO_RUN_NAME=sick \
  as_job_user sbatch "${sbatch_args[@]}" slurm/train_jumbo.sh) || fail sbatch
# check_failed ID EXIT RESTARTS PATTERN...: FAILED with that exit code and restart count,
# and each pattern in the log.
check_failed() {
  local id=$1 code=$2 restarts=$3 p
  shift 3
  log=$tmp/logs/j1-jumbo-$id.out
  wait_job "$id" FAILED 90 || fail "job $id did not end FAILED"
  [[ $(job_field "$id" ExitCode) == "$code:0" ]] || fail "job $id: ExitCode $(job_field "$id" ExitCode)"
  [[ $(job_field "$id" Restarts) == "$restarts" ]] || fail "job $id: Restarts $(job_field "$id" Restarts)"
  for p in "$@"; do grep -qF -- "$p" "$log" || fail "job $id: no '$p' in the log"; done
  grep "jumbo-slurm: \(requeued\|not requeued\)" "$log"
}
check_failed "$bad" 2 0 "unknown key train.lrr" \
  "jumbo-slurm: not requeued because jumbo info found a mistake"
check_failed "$fails" 3 1 \
  "jumbo-slurm: requeued because jumbo train failed (exit 3): failure 1 of at most JUMBO_MAX_FAILURES=1 per JUMBO_FAILURE_WINDOW_HOURS=24 h" \
  "jumbo-slurm: job $fails (restart 1)" \
  "jumbo-slurm: not requeued because jumbo train failed (exit 3) and the run has already been requeued after 1 failure(s) in the last 24 h"
check_failed "$sick" 1 0 "fake jumbo: doctor fails" \
  "jumbo-slurm: not requeued because jumbo doctor failed"
echo "ok: input mistake, repeated failure and failed doctor end FAILED as intended in $((SECONDS - t0)) s"
finish
