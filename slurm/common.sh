# slurm/common.sh: sourced by slurm/train_jumbo.sh, slurm/train_large.sh and slurm/sweep.sh.
# Functions only; nothing runs when it is sourced. Every decision the batch job takes is
# printed as one line starting with "jumbo-slurm:" so `grep jumbo-slurm: LOG` tells the
# story of a job (and its requeues: the log is opened with --open-mode=append).
#
# Exit codes of `jumbo train` (docs: README.md):
#   0   finished                         -> the job ends, COMPLETED
#   2   a user mistake (config, data)    -> not requeued: the same input fails again
#   75  graceful stop after SIGUSR1/TERM (a checkpoint was saved)
#                                        -> `scontrol requeue`: resumes from it (resume = auto)
#                                        (not requeued after a deadline stop other than
#                                        the job's own end: slurm/deadline.sh)
#   any other (a rank died, watchdog abort, node trouble)
#                                        -> requeued while the run has had fewer than
#                                           JUMBO_MAX_FAILURES failures in the last
#                                           JUMBO_FAILURE_WINDOW_HOURS, else it ends FAILED
# The restart budget is a rate, not a count over a job's life: a month-long run meets a
# hardware fault now and then, and only faults close together mean something is broken. The
# ledger (requeues.log) lives beside the checkpoints, which are the run: it counts across
# requeues and across jobs submitted again for the same run (a new job id).
# The batch shell exits with jumbo's code when it does not requeue; after a requeue Slurm
# ends the batch shell itself (the job goes REQUEUED -> PENDING and starts again, with
# SLURM_RESTART_COUNT incremented, after the BeginTime delay: AuthInfo's cred_expire, 70 s
# on ParallelCluster: aws-parallelcluster-cookbook, cookbooks/aws-parallelcluster-slurm/
# templates/default/slurm/slurm.conf.erb line 59; Slurm's default is 120 s).

# The doctor step of the batch job (jumbo_run_doctor), in its own file.
source "$(dirname "${BASH_SOURCE[0]}")/doctor.sh" || return 1
# The deadline stop (jumbo_schedule_deadline_stop), likewise.
source "$(dirname "${BASH_SOURCE[0]}")/deadline.sh" || return 1

JUMBO_EXIT_USER_ERROR=2
JUMBO_EXIT_GRACEFUL=75

jumbo_log() { printf '%(%F %T)T jumbo-slurm: %s\n' -1 "$*"; }

# jumbo_defaults RUN_NAME CONFIG: every JUMBO_* variable a user may set, with its default.
# JUMBO_HOME (the repository) is set by the script that sources this file.
jumbo_defaults() {
  : "${JUMBO_HOME:=${SLURM_SUBMIT_DIR:-$PWD}}"
  : "${JUMBO:=$JUMBO_HOME/build/jumbo}"
  : "${JUMBO_CONFIG:=$2}"
  : "${JUMBO_RUN_NAME:=$1}"
  : "${JUMBO_ROOT:=/fsx/jumbo}"
  : "${JUMBO_RUN_DIR:=$JUMBO_ROOT/runs/$JUMBO_RUN_NAME}"
  # NCCL's per-rank INIT/NET logs on the shared file system, beside the run (jumbo/comm/nccl_log.h).
  export JUMBO_NCCL_LOG_DIR=${JUMBO_NCCL_LOG_DIR:-$JUMBO_RUN_DIR/nccl}
  : "${JUMBO_CKPT_DIR:=$JUMBO_ROOT/checkpoints/$JUMBO_RUN_NAME}"
  : "${JUMBO_LAUNCHER:=srun}"
  # JUMBO_MAX_RESTARTS: the old name of JUMBO_MAX_FAILURES, still read.
  : "${JUMBO_MAX_FAILURES:=${JUMBO_MAX_RESTARTS:-3}}"
  : "${JUMBO_FAILURE_WINDOW_HOURS:=24}"
  JUMBO_MAX_RESTARTS=$JUMBO_MAX_FAILURES
  : "${JUMBO_END_TIME:=}"
  : "${JUMBO_CAPACITY_BLOCK_END:=}"
  : "${JUMBO_DEADLINE_MARGIN_S:=60}"
  : "${JUMBO_EXPECT_EFA:=1}"
  : "${JUMBO_EXPECT_GPUS:=}"
  : "${JUMBO_DOCTOR:=1}"
  : "${JUMBO_DRAIN_BAD_NODES:=1}"
  : "${JUMBO_DOCTOR_TIMEOUT:=300}"
  : "${JUMBO_DOCTOR_CHECK_TIMEOUT:=60}"
  : "${JUMBO_DOCTOR_LOCAL_TIMEOUT:=$((2 * ${JUMBO_DOCTOR_CHECK_TIMEOUT//[^0-9]/} + 60))}"
  : "${JUMBO_LAYOUT_FROM_PLAN:=1}"
  : "${JUMBO_GPU:=}"
  : "${JUMBO_MACHINE:=}"
  : "${JUMBO_SRUN_ARGS:=}"
  : "${JUMBO_MPIRUN_ARGS:=}"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
  JUMBO_STOP_SIGNAL=
  JUMBO_DEADLINE_KIND= JUMBO_DEADLINE_SOURCE= JUMBO_DEADLINE_TIMER_PID=
  JUMBO_LAUNCHER_PID=
  JUMBO_RC=
  JUMBO_DECISION=
}

# jumbo_exit CODE: ends the batch shell. A script may define jumbo_final_hook (sweep.sh
# writes its result file there); it runs first, with JUMBO_RC and JUMBO_DECISION set.
jumbo_exit() {
  : "${JUMBO_RC:=$1}" "${JUMBO_DECISION:=failed}"
  jumbo_cancel_deadline_stop
  declare -F jumbo_final_hook >/dev/null && jumbo_final_hook
  exit "$1"
}

# jumbo_fail_input MESSAGE: a mistake in what the user gave us: exit 2, never requeued.
jumbo_fail_input() {
  jumbo_log "not requeued because $*"
  JUMBO_DECISION=input_error
  jumbo_exit "$JUMBO_EXIT_USER_ERROR"
}

jumbo_check_inputs() {
  [[ -n ${SLURM_JOB_ID:-} ]] || jumbo_fail_input "this is not a Slurm job (submit it with sbatch)"
  [[ -x $JUMBO ]] || jumbo_fail_input "JUMBO=$JUMBO is not an executable (build it, or set JUMBO)"
  [[ -f $JUMBO_CONFIG ]] ||
    jumbo_fail_input "JUMBO_CONFIG=$JUMBO_CONFIG does not exist (relative to $PWD)"
  [[ $JUMBO_LAUNCHER == srun || $JUMBO_LAUNCHER == mpirun ]] ||
    jumbo_fail_input "JUMBO_LAUNCHER=$JUMBO_LAUNCHER: expected srun or mpirun"
  local v
  for v in JUMBO_MAX_FAILURES JUMBO_DOCTOR_TIMEOUT JUMBO_DOCTOR_CHECK_TIMEOUT JUMBO_DOCTOR_LOCAL_TIMEOUT; do
    [[ ${!v} =~ ^[0-9]+$ ]] || jumbo_fail_input "$v=${!v}: expected a whole number"
  done
  [[ $JUMBO_FAILURE_WINDOW_HOURS =~ ^[0-9]+$ && $JUMBO_FAILURE_WINDOW_HOURS -ge 1 ]] ||
    jumbo_fail_input "JUMBO_FAILURE_WINDOW_HOURS=$JUMBO_FAILURE_WINDOW_HOURS: expected a whole" \
      "number of hours, at least 1"
  jumbo_check_deadline_inputs
  [[ -z $JUMBO_EXPECT_GPUS || $JUMBO_EXPECT_GPUS =~ ^[0-9]+$ ]] ||
    jumbo_fail_input "JUMBO_EXPECT_GPUS=$JUMBO_EXPECT_GPUS: expected a whole number (or unset)"
  for v in JUMBO_EXPECT_EFA JUMBO_DOCTOR JUMBO_LAYOUT_FROM_PLAN JUMBO_DRAIN_BAD_NODES; do
    [[ ${!v} == 0 || ${!v} == 1 ]] || jumbo_fail_input "$v=${!v}: expected 0 or 1"
  done
  [[ -z $JUMBO_MACHINE || -r $JUMBO_MACHINE ]] ||
    jumbo_fail_input "JUMBO_MACHINE=$JUMBO_MACHINE: no readable file (a machine description:" \
      "slurm/preflight.sh writes one, RUN_DIR/machine.toml)"
}

# The run directory (metrics, EMF, NCCL's logs, doctor reports) and the checkpoint directory
# (with the requeue ledger) live on the shared file system: every node and every restart sees
# the same ones.
jumbo_prepare_dirs() {
  mkdir -p "$JUMBO_RUN_DIR" ||
    { jumbo_log "not requeued because the run directory $JUMBO_RUN_DIR cannot be created"
      jumbo_exit 1; }
  if [[ $JUMBO_CKPT_DIR != s3://* ]]; then
    mkdir -p "$JUMBO_CKPT_DIR" ||
      { jumbo_log "not requeued because the checkpoint directory $JUMBO_CKPT_DIR cannot be created"
        jumbo_exit 1; }
  fi
}

# jumbo_find_library FILE: the directory holding FILE on the dynamic loader's search path
# (LD_LIBRARY_PATH, then ld.so.cache); empty if none. As NCCL's dlopen will look for it.
jumbo_find_library() {
  local dir IFS=:
  for dir in ${LD_LIBRARY_PATH:-}; do
    [[ -n $dir && -e $dir/$1 ]] && { echo "$dir"; return 0; }
  done
  unset IFS
  dir=$(/sbin/ldconfig -p 2>/dev/null | awk -v f="$1" '$1 == f { print $NF; exit }')
  [[ -n $dir ]] && dirname "$dir"
  return 0
}

# NCCL over EFA (p4d: 4 x 100 Gbps) through the aws-ofi-nccl plugin. The facts and their
# sources: parallelcluster/README.md, "What the NCCL and EFA settings rest on". Only when EFA
# is expected: elsewhere these would send NCCL looking for a provider that is not there. A
# value the user's environment brings is kept.
jumbo_efa_env() {
  if [[ $JUMBO_EXPECT_EFA != 1 ]]; then
    jumbo_log "EFA: not expected (JUMBO_EXPECT_EFA=0); no FI_/NCCL_ network settings"
    return
  fi
  export FI_PROVIDER=${FI_PROVIDER:-efa}
  # aws-ofi-nccl under the EFA installer's prefix (ParallelCluster AMIs), on the path NCCL's
  # dlopen searches, unless the environment already finds a plugin elsewhere.
  local dir
  for dir in /opt/amazon/ofi-nccl/lib /opt/amazon/ofi-nccl/lib64 /opt/aws-ofi-nccl/lib; do
    if [[ -e $dir/libnccl-net.so || -e $dir/libnccl-net-ofi.so ]] && [[ ":${LD_LIBRARY_PATH:-}:" != *":$dir:"* ]]; then
      export LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      jumbo_log "EFA: $dir added to LD_LIBRARY_PATH (aws-ofi-nccl)"
      break
    fi
  done
  # With NCCL_NET_PLUGIN unset NCCL loads libnccl-net.so, which every aws-ofi-nccl installs
  # (1.14 as its only name; 1.15+ beside libnccl-net-ofi.so unless built with
  # --disable-nccl-net-symlink). NCCL_NET_PLUGIN=ofi makes NCCL < 2.21 try only
  # libnccl-net-ofi.so, absent before 1.15: NCCL would fall back to sockets without a word. So
  # it is set only when libnccl-net.so is missing and libnccl-net-ofi.so is there.
  if [[ -z ${NCCL_NET_PLUGIN+set} && -z $(jumbo_find_library libnccl-net.so) &&
        -n $(jumbo_find_library libnccl-net-ofi.so) ]]; then
    export NCCL_NET_PLUGIN=ofi
  fi
  # NCCL_DEBUG stays unset: jumbo sets NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,NET into one
  # file per rank (JUMBO_NCCL_LOG_DIR) and reads which network NCCL chose; a WARN brought in
  # hides those lines and comm.expect_network = efa then refuses the run (docs/config.md [comm]).
  # NCCL's bootstrap (TCP) on the instance's ENI, never loopback or container bridges.
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker,veth}
  # FI_EFA_USE_DEVICE_RDMA, RDMAV_FORK_SAFE, FI_EFA_FORK_SAFE: obsolete with libfabric >= 1.18,
  # aws-ofi-nccl >= 1.7 and kernels >= 5.15. NCCL_BUFFSIZE: not harmful but aws-ofi-nccl's to
  # set: on p4d (and p4de, p5...) the plugin itself sets NCCL_BUFFSIZE=8388608 and
  # NCCL_P2P_NET_CHUNKSIZE=524288 unless the environment already has them (aws-ofi-nccl commit
  # 2daf7d3, src/platform-aws.cpp lines 83-94, applied at line 687 without overwriting), so a
  # value brought in replaces the plugin's tuned one. Never set here; said when present.
  local v
  for v in FI_EFA_USE_DEVICE_RDMA RDMAV_FORK_SAFE FI_EFA_FORK_SAFE NCCL_BUFFSIZE NCCL_P2P_NET_CHUNKSIZE; do
    [[ -n ${!v:-} ]] && jumbo_log "warning: $v=${!v} is set in the environment; current" \
      "guidance is to leave it unset (aws-ofi-nccl sets the NCCL ones per instance type;" \
      "parallelcluster/README.md)"
  done
  jumbo_log "EFA: FI_PROVIDER=$FI_PROVIDER NCCL_NET_PLUGIN=${NCCL_NET_PLUGIN-(unset: libnccl-net.so)}" \
    "NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME" \
    "NCCL_DEBUG=${NCCL_DEBUG-(unset: jumbo logs INIT,NET per rank to $JUMBO_NCCL_LOG_DIR)}"
}

# Environment variables mpirun passes on with -x (srun passes the whole environment).
jumbo_mpirun_env_args() {
  local v
  for v in $(compgen -e); do
    case $v in
      FI_* | NCCL_* | OMP_* | CUDA_* | JUMBO_* | LD_LIBRARY_PATH | PATH) printf -- '-x\n%s\n' "$v" ;;
    esac
  done
}

# jumbo_launcher_cmd NTASKS_PER_NODE_OR_EMPTY NODES NTASKS: the launcher words, one per line.
jumbo_launcher_cmd() {
  local per_node=$1 nodes=$2 ntasks=$3 extra
  if [[ $JUMBO_LAUNCHER == srun ]]; then
    # --kill-on-bad-exit: one rank that dies (or a node that goes) ends the step instead of
    # leaving the others blocked in a collective. --cpus-per-task: srun 22.05 no longer
    # reads SLURM_CPUS_PER_TASK from the batch job, so it is passed on explicitly.
    printf '%s\n' srun --mpi=pmix --kill-on-bad-exit=1 --nodes="$nodes" --ntasks="$ntasks" \
      --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}"
    [[ -n $per_node ]] && printf '%s\n' --ntasks-per-node="$per_node"
    read -ra extra <<<"$JUMBO_SRUN_ARGS"
  else
    # Open MPI's mpirun in an allocation starts its daemons with srun on the allocated nodes.
    printf '%s\n' mpirun -np "$ntasks" --bind-to none
    [[ -n $per_node ]] && printf '%s\n' --map-by "ppr:$per_node:node"
    jumbo_mpirun_env_args
    read -ra extra <<<"$JUMBO_MPIRUN_ARGS"
  fi
  ((${#extra[@]})) && printf '%s\n' "${extra[@]}"
  return 0
}

# jumbo_drain NODES REASON: takes the nodes out of service. On ParallelCluster clustermgtd then
# replaces a drained node (parallelcluster/README.md). Draining needs a Slurm operator (root,
# SlurmUser, or AdminLevel=Operator in accounting): the job's user directly, else through sudo
# with scontrol's absolute path, since sudo looks commands up in its secure_path, not PATH, and
# ParallelCluster's lacks /opt/slurm/bin (aws-parallelcluster-cookbook, cookbooks/
# aws-parallelcluster-platform/recipes/install/sudo_install.rb lines 24-34): the default user
# (ec2-user, ubuntu) may sudo anything without a password, but `sudo scontrol` is "command not
# found". Where job users may not sudo, either make them operators (with accounting:
# `sacctmgr modify user NAME set adminlevel=operator`), or let root do it on the node: an
# Epilog script (slurm.conf Epilog=; ParallelCluster runs /opt/slurm/etc/scripts/epilog.d/*,
# slurm.conf.erb line 46) that drains the node named by the job's "doctor: failed node=" line.
jumbo_drain() {
  local nodes=$1 reason=$2 scontrol err
  scontrol=$(command -v scontrol)
  if err=$(scontrol update nodename="$nodes" state=drain reason="$reason" 2>&1) ||
     err=$(sudo -n "$scontrol" update nodename="$nodes" state=drain reason="$reason" 2>&1); then
    jumbo_log "doctor: drained $nodes (reason: $reason)"
    return 0
  fi
  jumbo_log "doctor: could not drain $nodes (neither scontrol nor sudo -n $scontrol may:" \
    "${err//$'\n'/; }); an administrator can: scontrol update nodename=$nodes state=drain" \
    "reason=\"$reason\""
  return 1
}

# The config and the arguments, checked once on the batch host before any step starts: a
# mistake (exit 2 from jumbo info) ends the job with jumbo's one-line message, not requeued.
jumbo_check_config() {
  local out rc
  out=$("$JUMBO" info --config "$JUMBO_CONFIG" "${JUMBO_JOB_SETS[@]}" "${JUMBO_USER_SETS[@]}" 2>&1)
  rc=$?
  if ((rc == JUMBO_EXIT_USER_ERROR)); then
    printf '%s\n' "$out" | grep -v "^--\|MPI_ABORT\|^$" | tail -5
    jumbo_fail_input "jumbo info found a mistake in $JUMBO_CONFIG or the arguments (above)"
  fi
  ((rc == 0)) && JUMBO_RESOLVED_CONFIG=$out
  return 0
}

# jumbo_config_value SECTION.KEY: the resolved value (after the config, its preset, the
# job's settings, the planned layout once jumbo_choose_layout chose it, and the user's --set
# overrides: jumbo train's order) from `jumbo info --config`, quotes removed; empty if absent.
jumbo_config_value() {
  local section=${1%%.*} key=${1#*.}
  [[ -n ${JUMBO_RESOLVED_CONFIG:-} ]] ||
    JUMBO_RESOLVED_CONFIG=$("$JUMBO" info --config "$JUMBO_CONFIG" "${JUMBO_JOB_SETS[@]}" \
      ${JUMBO_LAYOUT_SETS[@]+"${JUMBO_LAYOUT_SETS[@]}"} "${JUMBO_USER_SETS[@]}" 2>/dev/null)
  awk -v s="[$section]" -v k="$key" <<<"$JUMBO_RESOLVED_CONFIG" '
    /^\[/ { in_s = ($0 == s); next }
    in_s && $1 == k && $2 == "=" { v = $0; sub(/^[^=]*= */, "", v); gsub(/^"|"$/, "", v); print v; exit }'
}

# The --set arguments among the user's script arguments (for jumbo info).
jumbo_collect_user_sets() {
  JUMBO_USER_SETS=()
  local a prev=
  for a in "$@"; do
    if [[ $prev == --set ]]; then
      JUMBO_USER_SETS+=(--set "$a")
    elif [[ $a == --set=* ]]; then
      JUMBO_USER_SETS+=(--set "${a#--set=}")
    fi
    prev=$a
  done
}

# Does the user choose the layout (tp, pp, micro batch...) with an argument?
jumbo_user_sets_layout() {
  local a
  for a in "${JUMBO_USER_SETS[@]}"; do
    [[ $a =~ ^parallel\.(tp|pp|micro_batch|virtual_stages|stage_layers)= ]] && return 0
  done
  return 1
}

# Fills JUMBO_LAYOUT_SETS with `jumbo plan --best`'s overrides for this allocation (the
# config's model, global batch and precision, with the user's --set arguments), and prints
# the plan (the best layouts, memory per GPU) into the job log. No layout that fits is a
# mistake in the request (too few nodes for the model): exit 2, not requeued.
jumbo_choose_layout() {
  JUMBO_LAYOUT_SETS=()
  if [[ $JUMBO_LAYOUT_FROM_PLAN != 1 ]]; then
    jumbo_log "layout: from $JUMBO_CONFIG and the arguments (JUMBO_LAYOUT_FROM_PLAN=0)"
    return
  fi
  if jumbo_user_sets_layout; then
    jumbo_log "layout: set by the arguments (${JUMBO_USER_SETS[*]}); jumbo plan not used"
    return
  fi
  local gpu nodes=${SLURM_NNODES:-1} per_node plan_args best words i machine_per_node
  gpu=${JUMBO_GPU:-$(jumbo_config_value train.gpu)}
  gpu=${gpu:-a100-40gb}
  # One rank per GPU: the plan's "GPUs per node" is the ranks this job starts on a node.
  per_node=${SLURM_NTASKS_PER_NODE:-$((${SLURM_NTASKS:-8} / nodes))}
  plan_args=(plan --config "$JUMBO_CONFIG" "${JUMBO_JOB_SETS[@]}" "${JUMBO_USER_SETS[@]}"
    --nodes "$nodes")
  if [[ -n $JUMBO_MACHINE ]]; then
    # A measured machine (slurm/preflight.sh's comm stage) replaces the GPU's data sheet; its
    # ranks per host are the plan's GPUs per node, so they must be this job's.
    machine_per_node=$(sed -n 's/^ranks_per_host *= *\([0-9]*\).*/\1/p' "$JUMBO_MACHINE" | head -1)
    [[ $machine_per_node == "$per_node" ]] ||
      jumbo_fail_input "JUMBO_MACHINE=$JUMBO_MACHINE was measured with" \
        "${machine_per_node:-no} ranks per host (ranks_per_host), but this job runs $per_node" \
        "per node: measure this shape (slurm/preflight.sh with --ntasks-per-node=$per_node)" \
        "or unset JUMBO_MACHINE"
    plan_args+=(--machine "$JUMBO_MACHINE")
  else
    plan_args+=(--gpu "$gpu" --gpus-per-node "$per_node")
  fi
  jumbo_log "layout: $JUMBO ${plan_args[*]}"
  "$JUMBO" "${plan_args[@]}" --limit 10 2>&1 | sed 's/^/  plan: /'
  local part_nodes
  part_nodes=$(sinfo -h -p "${SLURM_JOB_PARTITION:-}" -o %D 2>/dev/null | awk '{n += $1} END {print n + 0}')
  best=$("$JUMBO" "${plan_args[@]}" --best 2>&1) ||
    jumbo_fail_input "jumbo plan found no layout for $nodes nodes x $per_node ranks: $best" \
      "(submit with sbatch --nodes=N: the scripts ask for no node count, and the partition" \
      "${SLURM_JOB_PARTITION:-?} has $part_nodes; or set the layout with --set" \
      "parallel.tp=... and JUMBO_LAYOUT_FROM_PLAN=0)"
  read -ra words <<<"$best"
  for ((i = 0; i < ${#words[@]}; i += 2)); do
    [[ ${words[i]} == --set && ${words[i + 1]:-} =~ ^[a-z_]+\.[a-z_0-9]+= ]] ||
      jumbo_fail_input "unexpected jumbo plan --best output '$best' (is JUMBO=$JUMBO current?)"
    JUMBO_LAYOUT_SETS+=(--set "${words[i + 1]}")
  done
  JUMBO_RESOLVED_CONFIG=  # jumbo_config_value reads the chosen layout from now on
  jumbo_log "layout: jumbo plan chose $best"
}

# What this job decides about the run: checkpoint and log locations, resume. (jumbo info
# and jumbo plan get them too: a config may rely on them, e.g. checkpoint.every without a dir.)
jumbo_job_sets() {
  JUMBO_JOB_SETS=(--set "checkpoint.dir=$JUMBO_CKPT_DIR" --set checkpoint.resume=auto
    --set "log.metrics_file=$JUMBO_RUN_DIR/metrics.jsonl"
    --set "log.emf_file=$JUMBO_RUN_DIR/emf.jsonl"
    --set "log.run_name=$JUMBO_RUN_NAME")
  # Where EFA is expected, a rank whose NCCL fell back to sockets refuses to train (jumbo names
  # the host and its NCCL log): on p4d a silent socket fallback is a run at a fraction of speed.
  [[ $JUMBO_EXPECT_EFA == 1 ]] && JUMBO_JOB_SETS+=(--set comm.expect_network=efa)
  return 0
}

# The arguments of `jumbo train`: the config, the job's settings, the planned layout, then
# the user's arguments, which win (the last --set of a key counts).
jumbo_train_args() {
  JUMBO_TRAIN_ARGS=(train --config "$JUMBO_CONFIG" "${JUMBO_JOB_SETS[@]}"
    "${JUMBO_LAYOUT_SETS[@]}" "$@")
}

# A stop signal for the batch shell: --signal=B:USR1@600 near the time limit, USR1 from
# `scancel -b -s USR1 JOBID` (a stop with a save and a requeue), TERM from plain scancel or
# preemption, INT by hand. Forwarded to the launcher as SIGUSR1, which srun and Open MPI's
# mpirun both pass on to every rank: jumbo finishes the step, saves, exits 75. After a plain
# scancel Slurm kills what is left KillWait seconds later (30 s on ParallelCluster, Slurm's
# default): too short for a large checkpoint, and a cancelled job is never requeued.
jumbo_on_stop() {
  JUMBO_STOP_SIGNAL=$1
  [[ $1 == USR2 ]] && jumbo_log "deadline: stopping now, ahead of the deadline from" \
    "$JUMBO_DEADLINE_SOURCE (slurm/deadline.sh)"
  [[ $1 == TERM ]] && jumbo_log "got SIGTERM (scancel or preemption): the job ends after Slurm's" \
    "KillWait; a checkpoint may not finish and the job is not requeued. To stop with a save" \
    "and a requeue: scancel -b -s USR1 ${SLURM_JOB_ID:-JOBID}"
  if [[ -n $JUMBO_LAUNCHER_PID ]] && kill -0 "$JUMBO_LAUNCHER_PID" 2>/dev/null; then
    jumbo_log "got SIG$1: forwarding SIGUSR1 to $JUMBO_LAUNCHER (pid $JUMBO_LAUNCHER_PID)" \
      "so jumbo saves a checkpoint and exits $JUMBO_EXIT_GRACEFUL"
    kill -USR1 "$JUMBO_LAUNCHER_PID" 2>/dev/null
  else
    jumbo_log "got SIG$1 before training started"
  fi
}

jumbo_install_traps() {
  trap 'jumbo_on_stop USR1' USR1
  trap 'jumbo_on_stop USR2' USR2  # the deadline timer (slurm/deadline.sh)
  trap 'jumbo_on_stop TERM' TERM
  trap 'jumbo_on_stop INT' INT
}

# jumbo_launch CMD...: runs CMD in the background (a foreground child would hold off the
# traps until it ended) and waits for it, however many signals arrive meanwhile. Sets
# JUMBO_RC to its exit status.
jumbo_launch() {
  if [[ -n $JUMBO_STOP_SIGNAL ]]; then
    # Nothing ran, nothing to save: requeued like a graceful stop, from the last checkpoint.
    JUMBO_RC=$JUMBO_EXIT_GRACEFUL
    jumbo_log "not starting jumbo train: SIG$JUMBO_STOP_SIGNAL arrived before the launch"
    return
  fi
  jumbo_log "launch: $*"
  "$@" &
  JUMBO_LAUNCHER_PID=$!
  # `wait` returns early (status > 128) when a trapped signal arrives; the launcher goes
  # on, so wait again until it is gone. bash keeps the status of a finished background
  # child, so the last `wait` returns it even if it ended in between.
  while kill -0 "$JUMBO_LAUNCHER_PID" 2>/dev/null; do
    wait "$JUMBO_LAUNCHER_PID"
  done
  wait "$JUMBO_LAUNCHER_PID"
  JUMBO_RC=$?
  JUMBO_LAUNCHER_PID=
  jumbo_log "jumbo train exited $JUMBO_RC"
}

# The requeue ledger: one line per requeue, beside the checkpoints (they are the run, whatever
# job writes them); for an s3:// checkpoint directory in the run directory instead, as a
# shell cannot append to an S3 object.
jumbo_ledger() {
  if [[ $JUMBO_CKPT_DIR == s3://* ]]; then
    echo "$JUMBO_RUN_DIR/requeues.log"
  else
    echo "$JUMBO_CKPT_DIR/requeues.log"
  fi
}

# Failures (not graceful stops) of the run in the last JUMBO_FAILURE_WINDOW_HOURS, from the
# ledger: every job of the run counts (a job submitted again has a new id). Counting only
# failures matters: a long run that is requeued at every time limit would otherwise run out
# of restarts. Lines without a time that date can read are counted (an old format, a hand edit).
jumbo_failures_so_far() {
  local ledger n=0 since line t
  ledger=$(jumbo_ledger)
  since=$(($(date +%s) - JUMBO_FAILURE_WINDOW_HOURS * 3600))
  if [[ -f $ledger ]]; then
    while read -r line; do
      [[ $line =~ reason=(failure|doctor) ]] || continue
      [[ $line =~ time=([^ ]+) ]] && t=$(jumbo_epoch "${BASH_REMATCH[1]}") || t=
      [[ -n $t ]] && ((t < since)) && continue
      ((n += 1))
    done <"$ledger"
  fi
  echo "$n"
}

# The budget in words, for the decision lines.
jumbo_failure_budget() {
  echo "JUMBO_MAX_FAILURES=$JUMBO_MAX_FAILURES per JUMBO_FAILURE_WINDOW_HOURS=$JUMBO_FAILURE_WINDOW_HOURS"
}

# jumbo_requeue REASON DETAIL: one ledger line, one log line, `scontrol requeue`. Slurm then
# ends this batch shell (the job shows "CANCELLED ... DUE TO JOB REQUEUE" in its log).
jumbo_requeue() {
  local reason=$1 detail=${*:2}
  printf 'job=%s restart=%s exit=%s reason=%s time=%(%FT%T%z)T\n' "$SLURM_JOB_ID" \
    "${SLURM_RESTART_COUNT:-0}" "$JUMBO_RC" "$reason" -1 >>"$(jumbo_ledger)"
  jumbo_log "requeued because $detail"
  trap - USR1 USR2 TERM INT  # Slurm's TERM that ends this shell is not a stop request
  jumbo_cancel_deadline_stop
  scontrol requeue "$SLURM_JOB_ID" && return 0
  jumbo_log "scontrol requeue $SLURM_JOB_ID failed (was the job submitted with --requeue," \
    "and does the cluster allow it: JobRequeue); ending with exit $JUMBO_RC"
  return 1
}

# jumbo_decide: what JUMBO_RC means for the job: prints the decision, requeues when that is
# the decision, and sets JUMBO_DECISION (finished, input_error, requeued, failed) and
# JUMBO_EXIT (the batch shell's exit status; after a requeue Slurm ends the shell anyway).
jumbo_decide() {
  local rc=$JUMBO_RC restarts=${SLURM_RESTART_COUNT:-0} failures
  JUMBO_EXIT=$rc
  case $rc in
    0)
      JUMBO_DECISION=finished
      jumbo_log "not requeued because training finished (exit 0; restarts $restarts)"
      return ;;
    "$JUMBO_EXIT_USER_ERROR")
      JUMBO_DECISION=input_error
      jumbo_log "not requeued because jumbo reported a mistake in the input (exit 2): fix it" \
        "and submit again"
      return ;;
    "$JUMBO_EXIT_GRACEFUL")
      if [[ $JUMBO_STOP_SIGNAL == USR2 && $JUMBO_DEADLINE_KIND != job ]]; then
        JUMBO_DECISION=stopped
        jumbo_log "not requeued because jumbo stopped gracefully (exit 75) ahead of the" \
          "deadline from $JUMBO_DEADLINE_SOURCE, after which these nodes are gone: submit" \
          "again where there is capacity; the run resumes from its newest checkpoint"
        return
      fi
      JUMBO_DECISION=requeued
      jumbo_requeue graceful "jumbo stopped gracefully (exit 75${JUMBO_STOP_SIGNAL:+ after SIG$JUMBO_STOP_SIGNAL})" \
        "and saved a checkpoint; the next run resumes from it (restart $((restarts + 1)))" ||
        JUMBO_DECISION=failed
      return ;;
  esac
  failures=$(jumbo_failures_so_far)
  if ((failures < JUMBO_MAX_FAILURES)); then
    JUMBO_DECISION=requeued
    jumbo_requeue failure "jumbo train failed (exit $rc): failure $((failures + 1)) of at" \
      "most $(jumbo_failure_budget) h; the next run resumes from the newest" \
      "checkpoint (restart $((restarts + 1)))" || JUMBO_DECISION=failed
    return
  fi
  JUMBO_DECISION=failed
  jumbo_log "not requeued because jumbo train failed (exit $rc) and the run has already" \
    "been requeued after $failures failure(s) in the last $JUMBO_FAILURE_WINDOW_HOURS h" \
    "($(jumbo_failure_budget) h; ledger $(jumbo_ledger))"
}

jumbo_print_job() {
  local array=${SLURM_ARRAY_JOB_ID:+, array task ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID:-}}
  jumbo_log "job ${SLURM_JOB_ID:-?}$array (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_NNODES:-?} node(s)" \
    "${SLURM_JOB_NODELIST:-?}, ${SLURM_NTASKS:-?} ranks, launcher $JUMBO_LAUNCHER"
  jumbo_log "binary $JUMBO; config $JUMBO_CONFIG; run $JUMBO_RUN_NAME in $JUMBO_RUN_DIR;" \
    "checkpoints $JUMBO_CKPT_DIR"
}

# jumbo_run_training RUN_NAME DEFAULT_CONFIG [ARGS...]: everything from the defaults to
# the decision (JUMBO_DECISION, JUMBO_EXIT); the caller exits. Variables set before the
# call (JUMBO_RUN_DIR, JUMBO_CKPT_DIR...) win over the defaults.
jumbo_run_training() {
  local name=$1 config=$2 cmd
  shift 2
  jumbo_install_traps
  jumbo_defaults "$name" "$config"
  cd "$JUMBO_HOME" || jumbo_fail_input "JUMBO_HOME=$JUMBO_HOME is not a directory"
  jumbo_check_inputs
  jumbo_print_job
  jumbo_prepare_dirs
  jumbo_schedule_deadline_stop
  jumbo_efa_env
  jumbo_job_sets
  jumbo_collect_user_sets "$@"
  jumbo_check_config
  jumbo_run_doctor
  jumbo_choose_layout
  jumbo_train_args "$@"
  mapfile -t cmd < <(jumbo_launcher_cmd "${SLURM_NTASKS_PER_NODE:-}" "${SLURM_NNODES:-1}" \
    "${SLURM_NTASKS:-1}")
  jumbo_launch "${cmd[@]}" "$JUMBO" "${JUMBO_TRAIN_ARGS[@]}"
  jumbo_decide
}

# jumbo_train_main RUN_NAME DEFAULT_CONFIG [ARGS...]: the whole batch job of train_*.sh.
jumbo_train_main() {
  jumbo_run_training "$@"
  jumbo_exit "$JUMBO_EXIT"
}
