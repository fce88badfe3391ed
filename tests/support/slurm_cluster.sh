# Sourced by test scripts: a one-node Slurm cluster on this machine, no systemd, no root
# configuration touched (everything lives under one directory and SLURM_CONF points at it).
#   start_slurm DIR            munged + slurmctld + slurmd with their config, state, logs and
#                              pid files under DIR; exports SLURM_CONF; returns once the node
#                              is idle (bounded). The node claims CPUs=8 whatever the machine has
#                              (and exports OMPI_MCA_mpi_yield_when_idle=1 for that reason).
#   stop_slurm                 cancels every job of this cluster, kills what is left of them
#                              and the three daemons, by PID (TERM, then KILL), removes DIR
#   wait_job JOBID STATE... TIMEOUT
#                              polls `scontrol show job` every 0.5 s until the job is in one of
#                              the STATEs; fails with the job's record and log on timeout or
#                              when it ends in a state not asked for
#   job_field JOBID FIELD      one field of `scontrol show job` (JobState, Restarts, ExitCode...)
#   slurm_logs                 the daemons' logs (for a test's failure message)
# Never `sbatch --wait`: it polls slowly (a 12 s job returns after ~40 s).
# Slurm 22.05 packages: slurmctld slurmd slurm-client munge (scripts/install-deps.sh).

_slurm_fail() { echo "slurm_cluster: $*" >&2; return 1; }

# Two free TCP ports on 127.0.0.1 (the kernel's choice), "PORT1 PORT2".
_slurm_free_ports() {
  python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks: s.close()'
}

# _slurm_wait_for SECONDS COMMAND...: runs COMMAND every 0.2 s until it succeeds.
_slurm_wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

_slurm_pid() { [[ -s $1 ]] && cat "$1"; }

# _slurm_kill PID NAME: TERM, up to 10 s, then KILL; only if PID is still that program.
_slurm_kill() {
  local pid=$1 name=$2
  [[ -n $pid ]] || return 0
  [[ $(ps -o comm= -p "$pid" 2>/dev/null) == "$name"* ]] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null
}

# The settings every test cluster shares (this one-node harness and slurm_multihost.sh):
# plugins that need no cgroups or systemd, no accounting, quick scheduling and timeouts.
# Prints slurm.conf lines; DIR holds munge's socket and the state.
_slurm_common_conf() {
  local dir=$1
  cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default
# 120 s, "Reason=BeginTime"); 10 s keeps the requeue tests short.
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# The main scheduling loop every second (default 60 s): a requeued job starts soon after
# its BeginTime instead of up to a minute later.
SchedulerParameters=sched_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
JobRequeue=1
ReturnToService=2
MaxArraySize=1001
# Short timeouts: a test waits for them.
MinJobAge=300
SlurmctldTimeout=10
MessageTimeout=10
KillWait=5
InactiveLimit=0
SlurmdParameters=config_overrides
EOF
  : >"$dir/plugstack.conf"  # none of the system's SPANK plugins
}

_slurm_write_conf() {
  local dir=$1 host=$2 ctld_port=$3 slurmd_port=$4
  {
    cat <<EOF
# Written by tests/support/slurm_cluster.sh: a one-node test cluster.
ClusterName=jumbotest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/log/slurmd.log
SlurmdTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    _slurm_common_conf "$dir"
  } >"$dir/slurm.conf"
}

# _slurm_start_munge_and_ctld DIR: munged (a fresh key) and slurmctld (a fresh state) of the
# cluster configured in DIR, each waited for (bounded); says what failed and returns 1.
# Shared with slurm_multihost.sh; the caller stops what did start.
_slurm_start_munge_and_ctld() {
  local dir=$1
  mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null 2>&1 ||
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  # --force: munged refuses to run as root otherwise.
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed" >"$dir/log/munged.out" 2>&1 ||
    { cat "$dir/log/munged.out" "$dir/munge/munged.log" >&2; return 1; }
  _slurm_wait_for 10 test -S "$dir/munge/munge.socket" ||
    { _slurm_fail "munged did not create its socket"; return 1; }
  # -c: a fresh state (nothing from an earlier cluster in this directory).
  slurmctld -c >"$dir/log/slurmctld.out" 2>&1 ||
    { cat "$dir/log/slurmctld.out" "$dir/log/slurmctld.log" >&2; return 1; }
  _slurm_wait_for 20 scontrol ping ||
    { _slurm_fail "slurmctld did not answer in 20 s"; cat "$dir/log/slurmctld.log" >&2; return 1; }
}

_slurm_no_running_jobs() {
  [[ -z $(squeue -h -t R,CG -o %A 2>/dev/null) ]]
}

_slurm_node_idle() {
  [[ $(sinfo -h -n "$1" -o %t 2>/dev/null) == idle ]]
}

start_slurm() {
  local dir=$1 prog
  for prog in munged mungekey slurmctld slurmd sbatch scontrol sinfo; do
    command -v "$prog" >/dev/null ||
      _slurm_fail "Slurm is not installed ($prog missing): run scripts/install-deps.sh" || return 1
  done
  [[ -z ${SLURM_TEST_DIR:-} ]] || _slurm_fail "a cluster is already running in $SLURM_TEST_DIR" ||
    return 1
  mkdir -p "$dir" && dir=$(cd "$dir" && pwd) || return 1
  SLURM_TEST_DIR=$dir
  mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" || return 1
  chmod 700 "$dir/munge"

  local host ports
  host=$(hostname -s)
  ports=$(_slurm_free_ports) || _slurm_fail "no free ports" || return 1
  # shellcheck disable=SC2086
  _slurm_write_conf "$dir" "$host" $ports
  export SLURM_CONF=$dir/slurm.conf
  # The node claims 8 CPUs on a machine with fewer: Open MPI then thinks it is not
  # oversubscribed and its ranks busy-poll against each other (a tiny training step takes
  # ~1 s instead of ~10 ms under srun or mpirun in a job). Yielding when idle avoids that.
  export OMPI_MCA_mpi_yield_when_idle=1

  _slurm_start_munge_and_ctld "$dir" || { stop_slurm; return 1; }
  slurmd >"$dir/log/slurmd.out" 2>&1 ||
    { cat "$dir/log/slurmd.out" "$dir/log/slurmd.log" >&2; stop_slurm; return 1; }
  _slurm_wait_for 30 _slurm_node_idle "$host" ||
    { _slurm_fail "node $host not idle after 30 s"; sinfo -N -l >&2; slurm_logs >&2
      stop_slurm; return 1; }
}

slurm_logs() {
  local f
  for f in "$SLURM_TEST_DIR"/log/slurmctld.log "$SLURM_TEST_DIR"/log/slurmd.log; do
    [[ -f $f ]] && { echo "== $f (last 30 lines)"; tail -30 "$f"; }
  done
}

stop_slurm() {
  local dir=${SLURM_TEST_DIR:-}
  [[ -n $dir ]] || return 0
  if scontrol ping >/dev/null 2>&1; then
    # Every job of this (private) cluster; SLURM_CONF points only at it.
    local jobs
    mapfile -t jobs < <(squeue -h -o %A 2>/dev/null | sort -u)
    ((${#jobs[@]} == 0)) || scancel --full "${jobs[@]}" 2>/dev/null
    _slurm_wait_for 20 _slurm_no_running_jobs
  fi
  # Whatever of the jobs survived (slurmstepd, ranks): the node's job pids, by PID.
  local pid
  for pid in $(scontrol listpids 2>/dev/null | awk 'NR > 1 && $1 ~ /^[0-9]+$/ {print $1}'); do
    kill -KILL "$pid" 2>/dev/null
  done
  _slurm_kill "$(_slurm_pid "$dir/slurmd.pid")" slurmd
  _slurm_kill "$(_slurm_pid "$dir/slurmctld.pid")" slurmctld
  _slurm_kill "$(_slurm_pid "$dir/munge/munged.pid")" munged
  unset SLURM_TEST_DIR SLURM_CONF
  rm -rf "$dir"
}

job_field() {
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}

# wait_job JOBID STATE... TIMEOUT
wait_job() {
  local id=$1 timeout=${*: -1} states=("${@:2:$#-2}") state deadline
  deadline=$((SECONDS + timeout))
  while :; do
    state=$(job_field "$id" JobState)
    local s
    for s in "${states[@]}"; do [[ $state == "$s" ]] && return 0; done
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
        # Only the end of a job; a requeued job passes through REQUEUED and PENDING instead.
        echo "wait_job: job $id ended $state, waiting for ${states[*]}" >&2
        _slurm_job_report "$id" >&2
        return 1 ;;
    esac
    if ((SECONDS >= deadline)); then
      echo "wait_job: job $id is ${state:-unknown} after ${timeout}s, waiting for ${states[*]}" >&2
      _slurm_job_report "$id" >&2
      return 1
    fi
    sleep 0.5
  done
}

_slurm_job_report() {
  local out
  scontrol show job "$1" 2>&1
  out=$(job_field "$1" StdOut)
  [[ -n $out && -f $out ]] && { echo "== $out (last 60 lines)"; tail -60 "$out"; }
}
