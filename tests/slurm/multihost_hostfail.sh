#!/usr/bin/env bash
# A host that goes away in the middle of a two-host job (tests/support/slurm_multihost.sh:
# host1 and host2, each a network + UTS namespace with its own slurmd). The tiny model, tp 2
# (within each host) x dp 2 (across them), 4 ranks, parallel.comm_timeout_s = 10 in the
# config, under slurm/train_jumbo.sh with srun --mpi=pmix. Once the metrics pass step 60
# (a checkpoint every 50 steps), host2's link is taken down: its ranks, slurmd and slurmstepd
# keep running but nothing reaches them. Checked:
#  - the training step ends on its own within the watchdog's timeout plus Slurm's KillWait
#    (30 s, ParallelCluster's: the step's tasks on the lost host never answer, so the step
#    ends when KillWait runs out) plus 20 s after the cut, and not before comm_timeout_s: the ranks on
#    host1 print the watchdog's line and abort with its exit code, 4;
#  - slurm/common.sh requeues the job as failure 1 (ledger line, Restarts=1), not Slurm
#    for a node failure;
#  - once the job is requeued the link comes back; the job runs again on host1 and host2,
#    resumes from the newest checkpoint saved before the cut (step S) and runs S+1 to the
#    last step in order, COMPLETED, exit 0; the steps both runs made have the same losses,
#    bit for bit.
# The job is submitted by the harness's unprivileged job user, as on ParallelCluster.
# Usage: multihost_hostfail.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
source tests/support/small_run.sh
source tests/support/slurm_multihost.sh
on_exit stop_multihost
# Not a failure of jumbo: ctest reports it skipped (SKIP_RETURN_CODE 77).
multihost_possible || skip "no hosts can be made on this machine"
# What a failure shows before the cleanup: the logs it needs.
failure_logs() {
  [[ -n ${log:-} && -f $log ]] && { echo "== $log"; tail -60 "$log"; }
  [[ -n ${id:-} ]] && scontrol show job "$id"
  multihost_logs
}
on_failure failure_logs
t_start=$SECONDS
steps=200
timeout_s=10
name=hostfail
metrics=$tmp/fsx/runs/$name/metrics.jsonl

mkdir -p "$tmp/data" "$tmp/logs"
make_small_data "$jumbo" "$tmp/data" || fail "could not make the small dataset"
cat >"$tmp/run.toml" <<EOF
[model]
preset = "inputs/models/tiny.toml"
[parallel]
tp = 2
micro_batch = 1
comm_timeout_s = $timeout_s
[train]
steps = $steps
global_batch = 8
lr = 3e-3
warmup_tokens = 0
[data]
train = "$tmp/data/data"
tokenizer = "$tmp/data/tok.model"
[checkpoint]
every = 50
[log]
every = 50
peak_tflops = 1
EOF

# One requeue to wait out: cred_expire 10 s, not ParallelCluster's 70 s. SlurmdTimeout 90 s:
# above the watchdog's 10 s + KillWait 30 s + srun's 2 s + a ping interval, as ParallelCluster's
# 180 s is, so srun returns the ranks' exit 4 before slurmctld can call host2 failed (at 30 s,
# the harness default, the two raced: a node-failure cancel sometimes came first).
MULTIHOST_SLURMD_TIMEOUT=90 SLURM_TEST_CRED_EXPIRE=10 start_multihost "$tmp/slurm" mhfail 2 4 ||
  fail "could not start the two-host cluster"
job_user_test_dirs "$tmp" "$repo" "$jumbo" || fail "the job user cannot use this checkout"
unset JUMBO_HOME JUMBO_RUN_DIR JUMBO_CKPT_DIR JUMBO_LAUNCHER JUMBO_SRUN_ARGS
export JUMBO=$jumbo JUMBO_CONFIG=$tmp/run.toml JUMBO_ROOT=$tmp/fsx JUMBO_EXPECT_EFA=0 \
  JUMBO_LAYOUT_FROM_PLAN=0 JUMBO_DOCTOR=0 JUMBO_MAX_FAILURES=3 JUMBO_RUN_NAME=$name \
  OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

metrics_step() {  # the last step in the metrics, 0 if none
  [[ -s $metrics ]] && tail -1 "$metrics" | sed -n 's/^{"step":\([0-9]*\),.*/\1/p' || echo 0
}

id=$(as_job_user sbatch --parsable --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
  --time=30 --output="$tmp/logs/%x-%j.out" slurm/train_jumbo.sh) || fail "sbatch"
log=$tmp/logs/j1-jumbo-$id.out
deadline=$((SECONDS + 60))
until (($(metrics_step) >= 60)); do
  ((SECONDS < deadline)) || fail "job $id did not reach step 60 in 60 s"
  sleep 0.1
done
[[ $(job_field "$id" NodeList) == "host[1-2]" ]] || fail "job $id runs on $(job_field "$id" NodeList)"
[[ $(job_field "$id" Restarts) == 0 ]] ||
  fail "job $id was requeued before the cut (something else failed; see its log)"
multihost_cut host2 || fail "could not take host2's link down"
cut_at=$SECONDS
cut_line=$(wc -l <"$log")  # what the job prints from here on is about the cut
after_cut() { tail -n "+$((cut_line + 1))" "$log"; }
echo "ok: job $id at step $(metrics_step) on host[1-2]; host2's link is down"

# The training step ends by itself (the watchdog), and the script requeues.
kill_wait=$(sed -n 's/^KillWait=//p' "$SLURM_CONF")
deadline=$((cut_at + timeout_s + kill_wait + 20))
until after_cut | grep -q "jumbo-slurm: jumbo train exited"; do
  ((SECONDS < deadline)) || fail "jumbo train still running $((SECONDS - cut_at)) s after host2" \
    "went away (parallel.comm_timeout_s = $timeout_s, KillWait = $kill_wait)"
  sleep 0.2
done
ended=$((SECONDS - cut_at))
((ended >= timeout_s - 1)) || fail "the step ended ${ended} s after the cut, before the watchdog's $timeout_s s"
after_cut | grep -qE "^jumbo: rank [01]: .* has waited [0-9]+ s \(parallel.comm_timeout_s = $timeout_s\): a peer rank failed or hangs; aborting the job" ||
  fail "no watchdog line from a rank on host1"
after_cut | grep -q "jumbo-slurm: jumbo train exited 4$" ||
  fail "jumbo train did not exit with the watchdog's code 4"
deadline=$((SECONDS + 30))
until [[ $(job_field "$id" Restarts) == 1 ]]; do
  ((SECONDS < deadline)) || fail "job $id not requeued"
  sleep 0.2
done
after_cut | grep -q "jumbo-slurm: requeued because jumbo train failed (exit 4): failure 1 of at most JUMBO_MAX_FAILURES=3 per JUMBO_FAILURE_WINDOW_HOURS=24 h" ||
  fail "no failure requeue line"
grep -q "^job=$id restart=0 exit=4 reason=failure" "$tmp/fsx/checkpoints/$name/requeues.log" ||
  fail "no failure in the requeue ledger"
saved=$(sed 's/^step_0*//' "$tmp/fsx/checkpoints/$name/latest")
reached=$(metrics_step)
((saved >= 50 && saved <= reached)) || fail "newest checkpoint step $saved (the run reached $reached)"
echo "ok: the step ended ${ended} s after the cut (watchdog: $timeout_s s), exit 4, requeued as" \
  "failure 1; newest checkpoint step $saved, the run had reached step $reached"

# The host comes back; the requeued job runs on both hosts again and resumes.
multihost_restore host2 || fail "could not bring host2's link back up"
wait_job "$id" COMPLETED 120 || fail "the requeued job did not complete"
[[ $(job_field "$id" ExitCode) == 0:0 ]] || fail "ExitCode $(job_field "$id" ExitCode)"
[[ $(job_field "$id" Restarts) == 1 ]] || fail "Restarts=$(job_field "$id" Restarts)"
grep -q "jumbo-slurm: job $id (restart 1) on 2 node(s) host\[1-2\], 4 ranks" "$log" ||
  fail "the second run was not on host[1-2] with 4 ranks"
grep -q "resumed from $tmp/fsx/checkpoints/$name/step_$(printf %08d "$saved") (step $saved" "$log" ||
  fail "did not resume from step $saved"
grep -q "jumbo-slurm: not requeued because training finished (exit 0; restarts 1)" "$log" ||
  fail "no final line"
python3 - "$metrics" "$saved" "$reached" "$steps" <<'EOF' || fail "the metrics of the two runs"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
saved, reached, steps = (int(a) for a in sys.argv[2:])
first = [r for r in rows[:reached]]
second = rows[reached:]
if [r["step"] for r in first] != list(range(1, reached + 1)):
    sys.exit(f"first run: steps {[r['step'] for r in first][:5]}... want 1..{reached}")
if [r["step"] for r in second] != list(range(saved + 1, steps + 1)):
    sys.exit(f"second run: steps {[r['step'] for r in second][:5]}... want {saved + 1}..{steps}")
again = [(a["step"], a["loss"], b["loss"]) for a, b in zip(first[saved:], second) if a["loss"] != b["loss"]]
if again:
    sys.exit(f"steps both runs made differ (step, first, second): {again[:5]}")
print(f"ok: first run steps 1..{reached}, resumed run {saved + 1}..{steps};"
      f" {reached - saved} steps made twice have the same losses")
EOF
grep "jumbo-slurm: \(requeued\|not requeued\|jumbo train exited\|job \)\|resumed from\|has waited" "$log"
echo "ok: host2 went away and came back: job $id requeued, resumed from step $saved, COMPLETED;" \
  "all in $((SECONDS - t_start)) s"
finish
