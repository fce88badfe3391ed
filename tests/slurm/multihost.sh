#!/usr/bin/env bash
# slurm/train_jumbo.sh and slurm/scaling.sh on a Slurm cluster of two hosts started here
# (tests/support/slurm_multihost.sh: two network + UTS namespaces, host1 and host2, each
# with its own slurmd and address on a bridge). The tiny model, 2 ranks per host:
#  1. `sbatch --nodes=2` of train_jumbo.sh with tp 2 under `srun --mpi=pmix` and under
#     JUMBO_LAUNCHER=mpirun: each job ends COMPLETED, every step in the metrics, the last
#     checkpoint complete; `jumbo doctor` ran once per host (2 ranks checked; rank 0's node
#     line names host1, and each of its warnings is repeated once for host2, never for
#     host1); the launcher words of slurm/common.sh put ranks 0-1 on host1 and 2-3 on host2
#     (their own host names); and jumbo's rank-0 placement line says every tp group is
#     within one host;
#  2. a deliberately bad placement (one rank per host, tp 2): the placement line names the
#     tp group that spans host1 and host2;
#  3. `mpirun --host host1:2,host2:2` outside Slurm (the rsh agent) puts 2 ranks on each;
#  4. `sbatch --nodes=2 slurm/scaling.sh strong` prints its table (1, 2, 4 ranks, the
#     allocation of both hosts named in its header).
# Every job is submitted by the harness's unprivileged job user (as on ParallelCluster); root
# only runs the harness and `mpirun --host` outside Slurm (its rsh agent enters namespaces).
# Usage: multihost.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
source tests/support/small_run.sh
source tests/support/slurm_multihost.sh
on_exit stop_multihost
# Not a failure of jumbo: ctest reports it skipped (SKIP_RETURN_CODE 77).
multihost_possible || skip "no hosts can be made on this machine"
# What a failure shows before the cleanup: the logs it needs.
failure_logs() {
  [[ -n ${log:-} && -f $log ]] && { echo "== $log"; tail -80 "$log"; }
  multihost_logs
}
on_failure failure_logs
t_start=$SECONDS

mkdir -p "$tmp/data" "$tmp/logs"
make_small_data "$jumbo" "$tmp/data" || fail "could not make the small dataset"
cat >"$tmp/run.toml" <<EOF
[model]
preset = "inputs/models/tiny.toml"
[parallel]
micro_batch = 1
[train]
steps = 8
global_batch = 8
eval_every = 4
eval_batches = 2
[data]
train = "$tmp/data/data"
valid = "$tmp/data/data"
tokenizer = "$tmp/data/tok.model"
[checkpoint]
every = 4
[log]
every = 1
peak_tflops = 1
EOF

# A launch that fails under srun requeues (check_doctor): cred_expire 10 s, not
# ParallelCluster's 70 s, keeps such a retry within the jobs' timeouts.
SLURM_TEST_CRED_EXPIRE=10 start_multihost "$tmp/slurm" mhjob 2 4 ||
  fail "could not start the two-host cluster"
echo "ok: hosts ${MULTIHOST_HOSTS[*]} up ($(sinfo -h -N -o '%N=%t' | tr '\n' ' '))"
# $tmp/data is also scaling.sh's work directory (it writes its run log there).
job_user_test_dirs "$tmp" "$repo" "$jumbo" && job_user_dirs "$tmp/data" ||
  fail "the job user cannot use this checkout"
unset JUMBO_HOME JUMBO_RUN_DIR JUMBO_CKPT_DIR JUMBO_RUN_NAME JUMBO_LAUNCHER JUMBO_SRUN_ARGS \
  JUMBO_MPIRUN_ARGS
export JUMBO=$jumbo JUMBO_CONFIG=$tmp/run.toml JUMBO_ROOT=$tmp/fsx JUMBO_EXPECT_EFA=0 \
  JUMBO_DOCTOR=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# --gpus-per-node=0 replaces the script's 8 GPUs; --time=30 stays clear of --signal=B:USR1@600.
sbatch_args=(--parsable --nodes=2 --cpus-per-task=1 --gpus-per-node=0 --time=30
  --output="$tmp/logs/%x-%j.out")

# check_doctor LOG WHAT: `jumbo doctor` ran once on each host. Its report (rank 0's) has rank
# 0's checks, then every other rank's warnings and failures prefixed with that rank's host
# name, then "doctor: N ranks checked". So: 2 ranks; one node line, naming host1; and, the
# hosts sharing one kernel (same clock, same libraries), each warning of rank 0 once more
# for host2 and never for host1 (no second rank there). Every run of the job script runs the
# doctor: where a launch failed and the job requeued (the script's own recovery), the last
# run's report is the one checked, and the requeue is printed.
check_doctor() {
  local doc c n
  doc=$(awk '/jumbo-slurm: doctor: .* doctor/ {block = ""; inside = 1}
    inside {block = block $0 "\n"}
    inside && /^([0-9]*: )?doctor: [0-9]* ranks checked/ {inside = 0; last = block}
    END {printf "%s", last}' "$1" | sed 's/^[0-9]*: //')
  grep "jumbo-slurm: requeued because" "$1" | sed "s/^/note: $2: /"
  grep -q "jumbo-slurm: doctor: every node passed" "$1" || fail "$2: the doctor did not pass"
  grep -q "^doctor: 2 ranks checked, 0 with a failed check" <<<"$doc" ||
    fail "$2: the doctor did not check 2 ranks: $doc"
  n=$(grep -cE "^ok +node +" <<<"$doc")
  [[ $n == 1 ]] && grep -qE "^ok +node +host1: " <<<"$doc" ||
    fail "$2: want one doctor node line, naming host1 (rank 0): $doc"
  grep -qE "^host1: " <<<"$doc" && fail "$2: a second doctor rank on host1: $doc"
  for c in $(awk '$1 == "warn" {print $2}' <<<"$doc"); do
    n=$(grep -cE "^host2: warn +$c " <<<"$doc")
    [[ $n == 1 ]] || fail "$2: host2 reports the '$c' warning $n times, want 1: $doc"
  done
  grep -E "^host[0-9]+: " <<<"$doc" | grep -qvE "^host2: " &&
    fail "$2: a doctor line from a host other than host2: $doc"
  return 0
}

# The placement line jumbo's rank 0 prints at start (the ranks' host names gathered): the
# hosts, with the ranks on each where it lists them, and whether a tp group spans hosts.
good_placement='^placement: 2 hosts( \(host1: 2 ranks, host2: 2 ranks\))?; every tp group within one host \(tp = 2\)$'

# check_train LAUNCHER NAME: a 4-rank tp 2 job on both hosts, checked from end to end.
check_train() {
  local launcher=$1 name=$2 id t0=$SECONDS steps ck hosts
  id=$(JUMBO_LAUNCHER=$launcher JUMBO_RUN_NAME=$name JUMBO_LAYOUT_FROM_PLAN=0 \
    as_job_user sbatch "${sbatch_args[@]}" --ntasks-per-node=2 slurm/train_jumbo.sh --set parallel.tp=2) ||
    fail "sbatch failed"
  log=$tmp/logs/j1-jumbo-$id.out
  wait_job "$id" COMPLETED 90 || fail "$launcher: job $id did not complete"
  [[ $(job_field "$id" ExitCode) == 0:0 ]] || fail "$launcher: exit code $(job_field "$id" ExitCode)"
  [[ $(job_field "$id" NodeList) == "host[1-2]" ]] ||
    fail "$launcher: job ran on $(job_field "$id" NodeList), not host[1-2]"
  grep -q "jumbo-slurm: launch: $launcher " "$log" || fail "$launcher: not launched with $launcher"
  check_doctor "$log" "$launcher"
  grep -q "layout tp 2 x pp 1 x dp 2 on 4 ranks" "$log" || fail "$launcher: not tp 2 x dp 2 on 4 ranks"
  grep -q "^step    8/8 " "$log" || fail "$launcher: no training lines"
  grep -qE "$good_placement" "$log" || fail "$launcher: no line matching '$good_placement'" \
    "(placement lines: $(grep '^placement' "$log" || echo none))"
  steps=$(python3 -c 'import json,sys
print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$tmp/fsx/runs/$name/metrics.jsonl")
  [[ $steps == "$(seq -s ' ' 1 8)" ]] || fail "$launcher: metrics steps are '$steps'"
  ck=$tmp/fsx/checkpoints/$name
  [[ -f $ck/step_00000008/manifest.json && $(cat "$ck/latest") == step_00000008 ]] ||
    fail "$launcher: no complete step-8 checkpoint in $ck"
  echo "ok: $launcher job $id COMPLETED on host[1-2] in $((SECONDS - t0)) s; doctor once per" \
    "host; $(grep '^placement' "$log")"
}

check_train srun mh-srun
check_train mpirun mh-mpirun

# The ranks' own host names under each launcher's words (slurm/common.sh's
# jumbo_launcher_cmd, as the job uses them): 2 on host1, 2 on host2, in rank order.
cat >"$tmp/where.sh" <<'EOF'
#!/usr/bin/env bash
source slurm/common.sh
mapfile -t cmd < <(jumbo_launcher_cmd 2 2 4)
"${cmd[@]}" bash -c 'echo "rank ${OMPI_COMM_WORLD_RANK:-$SLURM_PROCID} on $(hostname)"' | sort
EOF
for launcher in srun mpirun; do
  id=$(JUMBO_LAUNCHER=$launcher as_job_user sbatch "${sbatch_args[@]}" --ntasks-per-node=2 --job-name=where \
    "$tmp/where.sh") || fail "sbatch where.sh"
  log=$tmp/logs/where-$id.out
  wait_job "$id" COMPLETED 60 || fail "$launcher: the host-name job $id did not complete"
  got=$(grep '^rank ' "$log" | tr '\n' ' ')
  [[ $got == "rank 0 on host1 rank 1 on host1 rank 2 on host2 rank 3 on host2 " ]] ||
    fail "$launcher: ranks ran on '$got', want 2 per host in rank order"
  echo "ok: $launcher: $got"
done

# Outside Slurm: mpirun in this (the root) namespace starts its daemons on the hosts through
# the harness's rsh agent (OMPI_MCA_plm_rsh_agent).
got=$(timeout 60 mpirun -np 4 --host host1:2,host2:2 \
  bash -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname)"' 2>&1 | sort | tr '\n' ' ')
[[ $got == "rank 0 on host1 rank 1 on host1 rank 2 on host2 rank 3 on host2 " ]] ||
  fail "mpirun --host host1:2,host2:2 through the rsh agent: '$got'"
echo "ok: mpirun --host host1:2,host2:2 (rsh agent): $got"

# 2. One rank per host and tp 2: the tp group {0, 1} spans the hosts.
t0=$SECONDS
id=$(JUMBO_RUN_NAME=mh-spans JUMBO_LAYOUT_FROM_PLAN=0 JUMBO_DOCTOR=0 \
  as_job_user sbatch "${sbatch_args[@]}" --ntasks-per-node=1 slurm/train_jumbo.sh --set parallel.tp=2 \
  --set train.steps=2 --set train.eval_every=0 --set checkpoint.every=0) || fail "sbatch failed"
log=$tmp/logs/j1-jumbo-$id.out
wait_job "$id" COMPLETED FAILED 90 || fail "spanning placement: job $id did not end"
grep -q "layout tp 2 x pp 1 x dp 1 on 2 ranks" "$log" || fail "spanning placement: not tp 2 on 2 ranks"
grep -qE "^placement: 2 hosts( \(host1: 1 rank, host2: 1 rank\))?; the tp group of world rank 0 spans hosts host1 and host2" "$log" ||
  fail "spanning placement: no 'placement: 2 hosts; the tp group of world rank R spans hosts" \
    "host1 and host2' line (placement lines: $(grep '^placement' "$log" || echo none))"
echo "ok: one rank per host with tp 2 ($(job_field "$id" JobState) in $((SECONDS - t0)) s): $(grep '^placement' "$log")"

# 3. The scaling script across the two hosts (its data: the small dataset made above).
t0=$SECONDS
id=$(JUMBO_SCALING_DIR=$tmp/data as_job_user sbatch --parsable --nodes=2 --ntasks=4 --ntasks-per-node=2 --time=30 \
  --output="$tmp/logs/%x-%j.out" slurm/scaling.sh strong) || fail "sbatch scaling"
log=$tmp/logs/jumbo-scaling-$id.out
wait_job "$id" COMPLETED 120 || fail "scaling job $id did not complete"
grep -q "^scaling: strong on Slurm job $id (host\[1-2\], 4 tasks); ranks 1 2 4;" "$log" ||
  fail "scaling: no header naming the two-host allocation"
for np in 1 2 4; do
  grep -qE "^strong np=$np layout=\(1,1,$np\) global_batch=32 tokens/s=[0-9]+ efficiency=[0-9.]+$" "$log" ||
    fail "scaling: no table line for np=$np"
done
cat "$log"
echo "ok: slurm/scaling.sh strong across host1 and host2 in $((SECONDS - t0)) s"

# 5. slurm/preflight.sh, its CPU form, on both hosts (its parts alone: tests/slurm/preflight.sh):
# the doctor passes on each host, nccl-tests is skipped in one line (no GPU), `jumbo bench comm`
# measures the chosen layout's groups and writes the run's machine description (both levels:
# 2 ranks of a host share memory, the hosts talk TCP), and `jumbo bench train` runs run.toml on
# the 4 ranks with the layout `jumbo plan --best` chose for 2 hosts x 2 ranks, estimated on
# that machine; the table, and the machine-readable step line with the plan and the ratio.
t0=$SECONDS
machine=$tmp/fsx/runs/mh-preflight/machine.toml
id=$(JUMBO_RUN_NAME=mh-preflight as_job_user sbatch "${sbatch_args[@]}" --ntasks-per-node=2 \
  slurm/preflight.sh) || fail "sbatch preflight"
log=$tmp/logs/jumbo-preflight-$id.out
wait_job "$id" COMPLETED 90 || fail "preflight: job $id did not complete"
[[ $(job_field "$id" ExitCode) == 0:0 ]] || fail "preflight: exit code $(job_field "$id" ExitCode)"
chosen=$(sed -n 's/.*jumbo-slurm: layout: jumbo plan chose --set parallel.tp=\([0-9]*\) --set parallel.pp=\([0-9]*\) --set parallel.micro_batch=\([0-9]*\) .*/tp\1,pp\2,dp[0-9]+,mb\3,/p' "$log")
[[ -n $chosen ]] || fail "preflight: no 'layout: jumbo plan chose' line"
for want in '^preflight: stage +result +numbers$' \
  '^preflight: doctor +pass +every node passed \(2 nodes, host\[1-2\]\)$' \
  '^preflight: nccl-tests +skipped +no GPU on host1 \(nvidia-smi lists none\): the CPU form runs no all_reduce_perf$' \
  "^preflight: comm +pass +world all_reduce [0-9]+ B busbw=[0-9.]+ GB/s machine=$machine \(JUMBO_MACHINE=" \
  "^preflight: bench +pass +measured=[0-9.]+s plan=[0-9.]+s ratio=[0-9.]+ layout=$chosen.* device=cpu gpu=$machine ranks=4$" \
  "^preflight: step measured=[0-9.]+s plan=[0-9.]+s ratio=[0-9.]+ layout=$chosen.* device=cpu gpu=$machine ranks=4$" \
  '^preflight: passed: every stage passed or was skipped$'; do
  grep -qE "$want" "$log" || fail "preflight: no line matching '$want'"
done
grep '^preflight:' "$log"
# The description has both levels: the chosen layout's groups within a host (intra) and
# those across the hosts (inter).
for want in '^ranks_per_host = 2$' '^\[intra\.[a-z_]+\]$' '^\[inter\.[a-z_]+\]$'; do
  grep -qE "$want" "$machine" || fail "preflight: $machine has no line matching '$want'"
done
# A stage that fails is named and the job exits 1: train.device = cuda in this CPU-only build
# (the doctor, which would say so too, skipped). Its plan chooses the layout on the machine the
# first job measured (JUMBO_MACHINE), as train_jumbo.sh would.
cp "$machine" "$tmp/machine.toml" && chown "$JUMBO_JOB_USER" "$tmp/machine.toml"
id=$(JUMBO_RUN_NAME=mh-preflight-cuda JUMBO_DOCTOR=0 JUMBO_MACHINE=$tmp/machine.toml \
  as_job_user sbatch "${sbatch_args[@]}" --ntasks-per-node=2 slurm/preflight.sh \
  --set train.device=cuda) || fail "sbatch preflight"
log=$tmp/logs/jumbo-preflight-$id.out
wait_job "$id" FAILED 90 || fail "preflight with train.device=cuda: job $id did not fail"
[[ $(job_field "$id" ExitCode) == 1:0 ]] || fail "preflight: exit code $(job_field "$id" ExitCode), want 1:0"
for want in '^preflight: doctor +skipped +JUMBO_DOCTOR=0$' \
  "jumbo-slurm: layout: .* plan .* --machine $tmp/machine.toml$" \
  '^preflight: comm +fail +jumbo bench comm exited [1-9][0-9]* \(the lines above say why\)$' \
  '^preflight: bench +fail +jumbo bench train exited [1-9][0-9]* \(the lines above say why\)$' \
  '^preflight: FAILED: comm bench \(exit 1\)$'; do
  grep -qE "$want" "$log" || fail "preflight with train.device=cuda: no line matching '$want'"
done
echo "ok: slurm/preflight.sh (CPU form) on host1 and host2 in $((SECONDS - t0)) s; a failed" \
  "stage named: $(grep '^preflight: FAILED' "$log")"
echo "ok: all in $((SECONDS - t_start)) s"
finish
