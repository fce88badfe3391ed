# shellcheck shell=bash
# slurm/doctor.sh: the doctor step of the batch job (jumbo_run_doctor), sourced by
# slurm/common.sh; functions only. It uses jumbo_log, jumbo_exit, jumbo_drain, jumbo_requeue,
# jumbo_failures_so_far, jumbo_failure_budget, jumbo_launcher_cmd and jumbo_config_value
# from there.
#
# A bad node must be named even when it cannot take part in MPI (no EFA, a GPU hung in
# cuInit): so the checks come in two steps.
#  1. `jumbo doctor --local` on every node: srun, one task a node, no MPI at all (jumbo
#     starts none for --local: MPI_Init itself can hang on a bad node). Each check runs in a child process killed at
#     JUMBO_DOCTOR_CHECK_TIMEOUT (default 60 s; a check still running then failed, "hung after
#     N s"), the whole step under JUMBO_DOCTOR_LOCAL_TIMEOUT (default 2 x the check timeout +
#     60 s: the checks run at once, then DCGM's diagnostic, plus srun's start). Each node
#     writes its report to $JUMBO_RUN_DIR/doctor/job-JOB-run-RESTART/NODE.txt (atomically)
#     and to its stdout (this log, prefixed with its task number). A node of the allocation
#     with neither after the step is named too: "hung or unreachable".
#  2. Only if every node passed: `jumbo doctor --collective` (MPI across the nodes, the
#     ranks' clocks) with the job's launcher, one rank a node, under JUMBO_DOCTOR_TIMEOUT.
# On failure each failed node is named in a line "doctor: failed node=NAME node-checks=...
# software-checks=..." and the decision follows from whose fault it is:
#  - nodes with a node fault (a GPU or EFA device missing or hung, no report, the clock) are
#    drained (JUMBO_DRAIN_BAD_NODES=1), so no job gets them again;
#  - if that was all, the job requeues (a failure, counted against JUMBO_MAX_FAILURES per
#    JUMBO_FAILURE_WINDOW_HOURS) and
#    starts again on other nodes;
#  - a software fault (NCCL, the plugin, the build, the directory) fails on any node alike:
#    exit 1, not requeued, fix it and submit again.

# GPUs the doctor requires per node: JUMBO_EXPECT_GPUS; else one per rank when the run trains
# on CUDA (train.device, after the --set arguments); else what Slurm gave the job.
jumbo_expected_gpus() {
  if [[ -n $JUMBO_EXPECT_GPUS ]]; then
    echo "$JUMBO_EXPECT_GPUS"
  elif [[ $(jumbo_config_value train.device) == cuda ]]; then
    local per_node=${SLURM_NTASKS_PER_NODE:-$((${SLURM_NTASKS:-1} / ${SLURM_NNODES:-1}))}
    echo $((${SLURM_GPUS_ON_NODE:-0} > per_node ? SLURM_GPUS_ON_NODE : per_node))
  else
    echo "${SLURM_GPUS_ON_NODE:-0}"
  fi
}

jumbo_run_doctor() {
  if [[ $JUMBO_DOCTOR != 1 ]]; then
    jumbo_log "doctor: skipped (JUMBO_DOCTOR=0)"
    return
  fi
  local args=(doctor) gpus
  [[ $JUMBO_EXPECT_EFA == 1 ]] && args+=(--expect-efa)
  gpus=$(jumbo_expected_gpus)
  ((gpus > 0)) && args+=(--expect-gpus "$gpus")
  [[ $JUMBO_CKPT_DIR != s3://* ]] && args+=(--dir "$JUMBO_CKPT_DIR")
  [[ -n ${JUMBO_INSTANCE_TYPE:-} ]] && args+=(--instance-type "$JUMBO_INSTANCE_TYPE")
  jumbo_doctor_local "${args[@]}"
  jumbo_doctor_collective
  jumbo_log "doctor: every node passed"
}

# jumbo_doctor_local ARGS...: step 1; returns when every node passed, else decides and exits.
jumbo_doctor_local() {
  # The timeouts' defaults and checks: jumbo_defaults and jumbo_check_inputs (common.sh).
  local check_timeout=$JUMBO_DOCTOR_CHECK_TIMEOUT step_timeout=$JUMBO_DOCTOR_LOCAL_TIMEOUT
  local dir out rc node line
  dir=$JUMBO_RUN_DIR/doctor/job-${SLURM_JOB_ID:-0}-run-${SLURM_RESTART_COUNT:-0}
  if ! rm -rf "$dir" || ! mkdir -p "$dir"; then
    jumbo_log "not requeued because jumbo doctor cannot create its report directory $dir"
    jumbo_exit 1
  fi
  local nodes=() extra=()
  mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null)
  ((${#nodes[@]})) || nodes=("${SLURMD_NODENAME:-$(hostname)}")
  read -ra extra <<<"${JUMBO_SRUN_ARGS:-}"
  # srun whatever the launcher: these tasks start no MPI. --kill-on-bad-exit=0: a node that
  # fails must not end the others before they report.
  local cmd=(srun --mpi=none --kill-on-bad-exit=0 --nodes="${#nodes[@]}" --ntasks="${#nodes[@]}"
    --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" --label "${extra[@]}")
  local words=("$JUMBO" "$@" --local --report-dir "$dir" --check-timeout "$check_timeout")
  jumbo_log "doctor: node-local checks (step 1 of 2, at most $step_timeout s):" \
    "${cmd[*]} ${words[*]}"
  out=$(mktemp "${TMPDIR:-/tmp}/jumbo-doctor.XXXXXX")
  # `jumbo doctor --local` starts no MPI whatever the launcher (src/cli/main.cpp).
  timeout -k 10 "$step_timeout" "${cmd[@]}" "${words[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  local results=() missing=()
  for node in "${nodes[@]}"; do
    # The node's file; else its line on stdout (a report directory it could not write).
    line=$(grep -h "^doctor: \(failed\|passed\) node=$node\( \|$\)" "$dir/$node.txt" 2>/dev/null | tail -1)
    [[ -n $line ]] ||
      line=$(sed 's/^[0-9]*: //' "$out" | grep "^doctor: \(failed\|passed\) node=$node\( \|$\)" | tail -1)
    if [[ -n $line ]]; then
      results+=("$line")
    else
      missing+=("$node")
    fi
  done
  rm -f "$out"
  if ((${#missing[@]} == 0)) && ! printf '%s\n' "${results[@]}" | grep -q "^doctor: failed"; then
    jumbo_log "doctor: every node passed the node-local checks (${#nodes[@]} reports in $dir)"
    return
  fi
  local why
  if ((rc == 124 || rc == 137)); then
    why="hung or unreachable: no doctor report after $step_timeout s"
  elif ((${#missing[@]} == ${#nodes[@]})); then
    # Every node ended without a report and nothing hung: the binary or its settings (not
    # found, a crash everywhere), not the nodes.
    jumbo_log "not requeued because jumbo doctor failed on every node without writing its" \
      "report (exit $rc; see the lines above): the same on any node, so not drained; fix it and" \
      "submit again"
    jumbo_exit 1
  else
    why="ended without a doctor report (srun exit $rc)"
  fi
  for node in "${missing[@]}"; do
    jumbo_log "doctor: failed node=$node node-checks=report software-checks=- ($why)"
    results+=("doctor: failed node=$node node-checks=report software-checks=-")
  done
  jumbo_doctor_decide "$rc" "${missing[*]:+${missing[*]}: $why}" "${results[@]}"
}

# jumbo_doctor_collective: step 2; returns when it passed, else decides and exits.
jumbo_doctor_collective() {
  local count=${SLURM_NNODES:-1} cmd out rc
  mapfile -t cmd < <(jumbo_launcher_cmd 1 "$count" "$count")
  [[ $JUMBO_LAUNCHER == srun ]] && cmd+=(--label)
  jumbo_log "doctor: collective checks (step 2 of 2, at most $JUMBO_DOCTOR_TIMEOUT s):" \
    "${cmd[*]} $JUMBO doctor --collective"
  out=$(mktemp "${TMPDIR:-/tmp}/jumbo-doctor.XXXXXX")
  timeout "$JUMBO_DOCTOR_TIMEOUT" "${cmd[@]}" "$JUMBO" doctor --collective 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  local lines=()
  mapfile -t lines < <(sed 's/^[0-9]*: //' "$out" | grep "^doctor: failed node=")
  rm -f "$out"
  ((rc == 0)) && return
  jumbo_doctor_decide "$rc" "" "${lines[@]}"
}

# jumbo_doctor_decide RC UNNAMED_REASON LINES...: the decision after a failed step, from its
# "doctor: failed node=..." lines (UNNAMED_REASON: the reason for nodes without a report).
jumbo_doctor_decide() {
  local rc=$1 missing_reason=$2 line node hw sw bad_nodes=() software=() reason
  shift 2
  for line in "$@"; do
    [[ $line =~ doctor:\ failed\ node=([^ ]+)\ node-checks=([^ ]+)\ software-checks=([^ ]+) ]] || continue
    node=${BASH_REMATCH[1]} hw=${BASH_REMATCH[2]} sw=${BASH_REMATCH[3]}
    if [[ $hw == report ]]; then
      bad_nodes+=("$node")
      continue
    fi
    [[ $hw != - ]] && bad_nodes+=("$node") && reason+="${reason:+; }$node: $hw"
    [[ $sw != - ]] && software+=("$node: $sw")
  done
  [[ -n $missing_reason ]] && reason+="${reason:+; }$missing_reason"
  JUMBO_RC=1  # jumbo_requeue's ledger line; jumbo_exit's status
  local drained=0
  if ((${#bad_nodes[@]})); then
    local list
    list=$(IFS=,; echo "${bad_nodes[*]}")
    if [[ $JUMBO_DRAIN_BAD_NODES == 1 ]]; then
      jumbo_drain "$list" "jumbo doctor (job $SLURM_JOB_ID): $reason" && drained=1
    else
      jumbo_log "doctor: not draining $list (JUMBO_DRAIN_BAD_NODES=0)"
    fi
  fi
  if ((${#software[@]})); then
    jumbo_log "not requeued because jumbo doctor found software or settings missing (${software[*]};" \
      "the lines above, prefixed with the task = node number), which every node would lack alike:" \
      "install it (parallelcluster/README.md) and submit again"
    jumbo_exit 1
  fi
  if ((drained)); then
    local failures
    failures=$(jumbo_failures_so_far)
    if ((failures < JUMBO_MAX_FAILURES)); then
      JUMBO_DECISION=requeued
      jumbo_requeue doctor "jumbo doctor failed on ${bad_nodes[*]}, now drained: failure" \
        "$((failures + 1)) of at most $(jumbo_failure_budget) h; the job starts again on" \
        "other nodes" && jumbo_exit 1
      JUMBO_DECISION=failed
    fi
  fi
  jumbo_log "not requeued because jumbo doctor failed on at least one node (exit $rc; see" \
    "the lines above, prefixed with the task = node number; exclude a bad node with" \
    "sbatch --exclude)"
  jumbo_exit 1
}
