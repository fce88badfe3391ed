#!/usr/bin/env bash
# The requeue paths of slurm/train_jumbo.sh on a one-node Slurm cluster started here, each
# checked against an uninterrupted run of the same config and layout (tp 2 x pp 2, 4 ranks),
# which the resumed runs must reproduce bit for bit:
#  1. time limit: `scancel --signal=USR1 --batch` (what --signal=B:USR1@600 does) once the
#     metrics show step >= 20: the batch shell forwards SIGUSR1 through srun, jumbo saves and
#     exits 75, the script requeues, the job runs again (Restarts=1), resumes from the step
#     it saved and ends COMPLETED with the reference's losses for every step after it; the
#     same with JUMBO_LAUNCHER=mpirun (Open MPI's mpirun forwards SIGUSR1 too);
#  2. node failure: SIGKILL to one rank (a PID from `scontrol listpids`): srun's
#     --kill-on-bad-exit ends the step (no hang), the script requeues it as failure 1 of 3,
#     and the job resumes from its last periodic checkpoint and finishes with the same
#     losses as the reference;
#  3. the restart rate: a run whose ledger (checkpoint directory, requeues.log) holds failures
#     older than JUMBO_FAILURE_WINDOW_HOURS (not counted), a graceful stop (not counted) and
#     a recent failure of an earlier job of the run (counted), under JUMBO_MAX_FAILURES=2: a
#     job failing every time is requeued once (failure 2 of 2), then ends FAILED;
#  4. the deadline stop: JUMBO_END_TIME a few seconds ahead, the last save measured at 1 s
#     (last_save.json): the job says when it will stop, signals itself, jumbo saves a
#     checkpoint before that time and exits 75, and the job is not requeued (FAILED, 75:0);
#     at once a job with an unreadable JUMBO_END_TIME ends with exit 2 and one line.
# Every job is submitted (and signalled) by the harness's unprivileged job user
# (tests/support/slurm_cluster.sh), as on ParallelCluster.
# Usage: requeue.sh JUMBO REPO   (JUMBO with graceful stop: exit 75 on SIGUSR1)
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
source tests/support/small_run.sh
source tests/support/slurm_cluster.sh
on_exit stop_slurm
# What a failure shows before the cleanup: the logs it needs.
failure_logs() {
  [[ -n ${log:-} && -f $log ]] && { echo "== $log"; tail -60 "$log"; }
}
on_failure failure_logs
steps=600

mkdir -p "$tmp/data" "$tmp/logs"
make_small_data "$jumbo" "$tmp/data" || fail "could not make the small dataset"
cat >"$tmp/run.toml" <<EOF
[model]
preset = "inputs/models/tiny.toml"
[parallel]
tp = 2
pp = 2
micro_batch = 1
[train]
steps = $steps
global_batch = 8
lr = 3e-3
warmup_tokens = 0
[data]
train = "$tmp/data/data"
tokenizer = "$tmp/data/tok.model"
[checkpoint]
every = 100
[log]
every = 100
peak_tflops = 1
EOF

# Requeues are what this test waits for: cred_expire 10 s, not ParallelCluster's 70 s (the
# BeginTime delay of each requeue; 4 requeues would add 4 minutes), and KillWait 5 s, not 30:
# the ranks left after a rank is killed sit in a collective and do not act on the step's
# SIGTERM, so the killed-rank case waits KillWait for their SIGKILL (the requeue path is the
# same either way; multihost_hostfail keeps 30).
SLURM_TEST_CRED_EXPIRE=10 SLURM_TEST_KILL_WAIT=5 start_slurm "$tmp/slurm" || fail "could not start Slurm"
job_user_test_dirs "$tmp" "$repo" "$jumbo" || fail "the job user cannot use this checkout"
# Not root: Open MPI's permission to run as root is withdrawn, so a job that did would fail.
unset JUMBO_HOME JUMBO_RUN_DIR JUMBO_CKPT_DIR JUMBO_RUN_NAME JUMBO_LAUNCHER JUMBO_MAX_RESTARTS \
  JUMBO_FAILURE_WINDOW_HOURS JUMBO_END_TIME JUMBO_CAPACITY_BLOCK_END JUMBO_DEADLINE_MARGIN_S \
  OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
export JUMBO=$jumbo JUMBO_CONFIG=$tmp/run.toml JUMBO_ROOT=$tmp/fsx JUMBO_EXPECT_EFA=0 \
  JUMBO_LAYOUT_FROM_PLAN=0 JUMBO_DOCTOR=${JUMBO_DOCTOR:-1} JUMBO_MAX_FAILURES=3 OMP_NUM_THREADS=1

# submit RUN_NAME: the job id; its log is $tmp/logs/j1-jumbo-ID.out. --time well above the
# script's --signal=B:USR1@600: with --time=10 Slurm would send the time-limit USR1 within
# its first minute (a stray graceful stop and requeue in every job).
submit() {
  JUMBO_RUN_NAME=$1 as_job_user sbatch --parsable --nodes=1 --ntasks-per-node="${RANKS:-4}" \
    --cpus-per-task=1 --gpus-per-node=0 --time=30 --output="$tmp/logs/%x-%j.out" slurm/train_jumbo.sh
}
metrics_step() {  # the last step in a metrics file, 0 if none
  local f=$tmp/fsx/runs/$1/metrics.jsonl
  [[ -s $f ]] && tail -1 "$f" | sed -n 's/^{"step":\([0-9]*\),.*/\1/p' || echo 0
}
# wait_step RUN K SECONDS: until the run's metrics reach step K.
wait_step() {
  local deadline=$((SECONDS + $3))
  while (($(metrics_step "$1") < $2)); do
    ((SECONDS < deadline)) || fail "$1 did not reach step $2 in $3 s"
    sleep 0.1
  done
}
# same_losses RUN: every step of RUN's metrics (repeated steps included: a resumed run
# repeats those after its checkpoint) has the reference's loss, bit for bit, and the last
# line is step $steps.
same_losses() {
  python3 - "$tmp/fsx/runs/reference/metrics.jsonl" "$tmp/fsx/runs/$1/metrics.jsonl" "$steps" <<'EOF'
import json, sys
ref = {}
for l in open(sys.argv[1]):
    d = json.loads(l)
    ref[d["step"]] = repr(d["loss"])
rows = [json.loads(l) for l in open(sys.argv[2])]
bad = [(r["step"], repr(r["loss"]), ref.get(r["step"])) for r in rows if repr(r["loss"]) != ref.get(r["step"])]
if bad:
    sys.exit(f"losses differ from the reference (step, got, want): {bad[:5]}")
if rows[-1]["step"] != int(sys.argv[3]):
    sys.exit(f"last step {rows[-1]['step']}")
print(f"{len(rows)} metrics lines, final loss {rows[-1]['loss']!r} = the reference's")
EOF
}

# The reference: the same job, never interrupted.
t0=$SECONDS
id=$(submit reference) || fail "sbatch"
log=$tmp/logs/j1-jumbo-$id.out
wait_job "$id" COMPLETED 120 || fail "reference job"
[[ $(metrics_step reference) == "$steps" ]] || fail "reference ended at step $(metrics_step reference)"
echo "ok: reference job $id: $steps steps in $((SECONDS - t0)) s, final loss" \
  "$(tail -1 "$tmp/fsx/runs/reference/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')"

# 1. The time-limit signal, under srun and under the mpirun fallback (both pass SIGUSR1 on
# to the ranks).
graceful_case() {
  local launcher=$1 name=$2 id stopped t0=$SECONDS
  id=$(JUMBO_LAUNCHER=$launcher submit "$name") || fail "sbatch"
  log=$tmp/logs/j1-jumbo-$id.out
  wait_step "$name" 20 60
  as_job_user scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1 --batch $id"
  # The requeued job waits out its BeginTime (cred_expire = 10 s in the test cluster).
  wait_job "$id" COMPLETED 150 || fail "$launcher: signalled job"
  [[ $(job_field "$id" Restarts) == 1 ]] || fail "$launcher: Restarts=$(job_field "$id" Restarts)"
  [[ $(job_field "$id" ExitCode) == 0:0 ]] || fail "$launcher: ExitCode $(job_field "$id" ExitCode)"
  stopped=$(sed -n 's/^stopping after step \([0-9]*\) of .* on SIGUSR1: checkpoint saved.*/\1/p' "$log")
  [[ -n $stopped ]] || fail "$launcher: jumbo did not report a graceful stop on SIGUSR1"
  ((stopped < steps)) || fail "$launcher: stopped only at the last step"
  grep -q "jumbo-slurm: got SIGUSR1: forwarding SIGUSR1 to $launcher" "$log" ||
    fail "$launcher: no forwarding line"
  grep -q "jumbo-slurm: jumbo train exited 75" "$log" || fail "$launcher: jumbo did not exit 75"
  grep -q "jumbo-slurm: requeued because jumbo stopped gracefully (exit 75 after SIGUSR1)" "$log" ||
    fail "$launcher: no requeue line"
  grep -q "jumbo-slurm: job $id (restart 1)" "$log" ||
    fail "$launcher: the second run did not see SLURM_RESTART_COUNT=1"
  grep -q "resumed from $tmp/fsx/checkpoints/$name/step_$(printf %08d "$stopped") (step $stopped" "$log" ||
    fail "$launcher: did not resume from step $stopped"
  grep -q "jumbo-slurm: not requeued because training finished (exit 0; restarts 1)" "$log" ||
    fail "$launcher: no final line"
  same_losses "$name" || fail "$launcher: signalled run"
  grep "jumbo-slurm: \(got\|requeued\|not requeued\|jumbo train exited\)" "$log"
  echo "ok: $launcher: signalled at step >= 20, stopped after step $stopped, requeued, resumed," \
    "COMPLETED with the reference's losses in $((SECONDS - t0)) s"
}
graceful_case srun signalled
graceful_case mpirun signalled-mpirun

# 3 and 4 are submitted now and run beside 2 (4 + 1 + 2 + 1 ranks on the node's 8 CPUs).
t34=$SECONDS
# A stand-in binary that fails one verb and runs the real one else.
cat >"$tmp/fake-jumbo" <<EOF
#!/usr/bin/env bash
if [[ \$1 == \${FAKE_FAIL:-none} ]]; then echo "fake jumbo: \$1 fails"; exit \$FAKE_FAIL_CODE; fi
exec $jumbo "\$@"
EOF
chmod 755 "$tmp/fake-jumbo"
# 3. The ledger of run "rate" before its job: what counts is a failure or doctor line of the
# last 24 h, whichever job of the run wrote it.
iso_ago() { date -d "@$(($(date +%s) - $1 * 3600))" +%FT%T%z; }
job_user_dirs "$tmp/fsx/checkpoints" "$tmp/fsx/checkpoints/rate" "$tmp/fsx/checkpoints/deadline"
cat >"$tmp/fsx/checkpoints/rate/requeues.log" <<EOF
job=900 restart=0 exit=4 reason=failure time=$(iso_ago 50)
job=900 restart=1 exit=1 reason=doctor time=$(iso_ago 49)
job=901 restart=0 exit=4 reason=failure time=$(iso_ago 30)
job=902 restart=0 exit=75 reason=graceful time=$(iso_ago 2)
job=903 restart=0 exit=4 reason=failure time=$(iso_ago 1)
EOF
chown "$JUMBO_JOB_USER:" "$tmp/fsx/checkpoints/rate/requeues.log"
rate=$(RANKS=1 JUMBO=$tmp/fake-jumbo FAKE_FAIL=train FAKE_FAIL_CODE=3 JUMBO_MAX_FAILURES=2 \
  JUMBO_FAILURE_WINDOW_HOURS=24 submit rate) || fail "sbatch"
# 4. The deadline: the last save took 1 s, the margin is 2 s, no step measured yet (a new run):
# the stop comes 3 s before JUMBO_END_TIME, which leaves the job ~30 s to start and train.
sed 's/^steps = .*/steps = 1000000/; s/^every = 100$/every = 1000000/; s/^pp = 2$/pp = 1/; s/^tp = 2$/tp = 1/' \
  "$tmp/run.toml" >"$tmp/long.toml"
echo '{"step":100,"bytes":1000,"seconds":1.2}' >"$tmp/fsx/checkpoints/deadline/last_save.json"
chown "$JUMBO_JOB_USER:" "$tmp/fsx/checkpoints/deadline/last_save.json"
end=$(($(date +%s) + 35))
end_iso=$(date -u -d "@$end" +%FT%TZ)
dl_job=$(RANKS=2 JUMBO_CONFIG=$tmp/long.toml JUMBO_END_TIME=$end_iso JUMBO_DEADLINE_MARGIN_S=2 \
  submit deadline) || fail "sbatch"
badtime=$(RANKS=1 JUMBO_END_TIME=soonish submit badtime) || fail "sbatch"

# 2. A rank killed: the job must end (not hang), requeue as a failure and finish.
t0=$SECONDS
id=$(submit killed) || fail "sbatch"
log=$tmp/logs/j1-jumbo-$id.out
wait_step killed 150 60
# A rank: a jumbo process of the job's training step (not the batch step), the last one.
victim=$(scontrol listpids "$id" 2>/dev/null | awk 'NR > 1 && $3 != "batch" && $3 != "-" {print $1}' |
  while read -r pid; do [[ $(ps -o comm= -p "$pid" 2>/dev/null) == jumbo ]] && echo "$pid"; done |
  sort -n | tail -1)
[[ -n $victim ]] || { scontrol listpids "$id"; fail "no rank process of job $id"; }
kill -KILL "$victim"
killed_at=$SECONDS
deadline=$((SECONDS + 60))
until [[ $(job_field "$id" Restarts) == 1 ]]; do
  ((SECONDS < deadline)) || fail "job $id not requeued 60 s after rank pid $victim was killed"
  sleep 0.2
done
echo "ok: requeued $((SECONDS - killed_at)) s after the kill"
wait_job "$id" COMPLETED 150 || fail "killed job"
[[ $(job_field "$id" ExitCode) == 0:0 ]] || fail "killed job: ExitCode $(job_field "$id" ExitCode)"
grep -q "jumbo-slurm: requeued because jumbo train failed (exit [0-9]*): failure 1 of at most JUMBO_MAX_FAILURES=3 per JUMBO_FAILURE_WINDOW_HOURS=24 h" "$log" ||
  fail "no failure requeue line"
grep -q "^job=$id restart=0 exit=[0-9]* reason=failure" "$tmp/fsx/checkpoints/killed/requeues.log" ||
  fail "no failure in the requeue ledger (the checkpoint directory's requeues.log)"
grep -q "resumed from $tmp/fsx/checkpoints/killed/step_" "$log" || fail "did not resume"
grep -q "jumbo-slurm: not requeued because training finished (exit 0; restarts 1)" "$log" ||
  fail "no final line"
same_losses killed || fail "killed run"
grep "jumbo-slurm: \(requeued\|not requeued\|jumbo train exited\)\|resumed from" "$log"
echo "ok: rank killed, job requeued and resumed, COMPLETED with the reference's losses in" \
  "$((SECONDS - t0)) s"

# 3 and 4: checked here; submitted before 2, to run beside it.

log=$tmp/logs/j1-jumbo-$badtime.out
wait_job "$badtime" FAILED 60 || fail "job $badtime (JUMBO_END_TIME=soonish)"
[[ $(job_field "$badtime" ExitCode) == 2:0 ]] || fail "badtime: ExitCode $(job_field "$badtime" ExitCode)"
grep -q "jumbo-slurm: not requeued because JUMBO_END_TIME=soonish: expected an ISO 8601 time" "$log" ||
  fail "badtime: no line naming JUMBO_END_TIME"
echo "ok: JUMBO_END_TIME=soonish refused with exit 2"

log=$tmp/logs/j1-jumbo-$rate.out
wait_job "$rate" FAILED 120 || fail "job $rate (the restart rate)"
[[ $(job_field "$rate" ExitCode) == 3:0 ]] || fail "rate: ExitCode $(job_field "$rate" ExitCode)"
[[ $(job_field "$rate" Restarts) == 1 ]] ||
  fail "rate: Restarts $(job_field "$rate" Restarts), expected 1 (one recent failure in the ledger, at most 2)"
grep -qF "jumbo-slurm: requeued because jumbo train failed (exit 3): failure 2 of at most JUMBO_MAX_FAILURES=2 per JUMBO_FAILURE_WINDOW_HOURS=24 h" "$log" ||
  fail "rate: no 'failure 2 of at most 2' requeue line"
grep -qF "jumbo-slurm: not requeued because jumbo train failed (exit 3) and the run has already been requeued after 2 failure(s) in the last 24 h" "$log" ||
  fail "rate: no final line counting 2 recent failures"
grep -q "^job=$rate restart=0 exit=3 reason=failure time=" "$tmp/fsx/checkpoints/rate/requeues.log" ||
  fail "rate: the failure is not in the ledger"
grep "jumbo-slurm: \(requeued\|not requeued\)" "$log"
echo "ok: restart rate: 3 failures older than 24 h not counted, 1 recent one of an earlier job" \
  "counted; requeued once, then FAILED"

log=$tmp/logs/j1-jumbo-$dl_job.out
wait_job "$dl_job" FAILED 90 || fail "job $dl_job (the deadline stop)"
[[ $(job_field "$dl_job" ExitCode) == 75:0 ]] || fail "deadline: ExitCode $(job_field "$dl_job" ExitCode)"
[[ $(job_field "$dl_job" Restarts) == 0 ]] || fail "deadline: requeued"
grep -qE "jumbo-slurm: deadline: .* from JUMBO_END_TIME=$end_iso; graceful stop at .* \(in [0-9]+ s\), 3 s before it: last save 1 s \+ step 0 s \+ margin 2 s" "$log" ||
  fail "deadline: no line saying the deadline, its source and when the stop comes"
grep -q "jumbo-slurm: deadline: stopping now, ahead of the deadline from JUMBO_END_TIME=$end_iso" "$log" ||
  fail "deadline: the timer did not fire"
stopped=$(sed -n 's/^stopping after step \([0-9]*\) of .* on SIGUSR1: checkpoint saved.*/\1/p' "$log")
[[ -n $stopped ]] || fail "deadline: jumbo did not stop gracefully on SIGUSR1"
ck=$tmp/fsx/checkpoints/deadline/step_$(printf %08d "$stopped")
[[ -f $ck/manifest.json && $(cat "$tmp/fsx/checkpoints/deadline/latest") == "${ck##*/}" ]] ||
  fail "deadline: no complete checkpoint $ck"
saved_at=$(stat -c %Y "$ck/manifest.json")
((saved_at < end)) || fail "deadline: the checkpoint was written $((saved_at - end)) s after the deadline"
grep -q "jumbo-slurm: not requeued because jumbo stopped gracefully (exit 75) ahead of the deadline" "$log" ||
  fail "deadline: no decision line"
grep "jumbo-slurm: \(deadline\|not requeued\|jumbo train exited\)\|^stopping after" "$log"
echo "ok: deadline stop: checkpoint step $stopped saved $((end - saved_at)) s before JUMBO_END_TIME," \
  "exit 75, not requeued; cases 3 and 4 (beside 2) in $((SECONDS - t34)) s"
finish
