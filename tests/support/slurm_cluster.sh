# Sourced by test scripts: a one-node Slurm cluster on this machine, no systemd, no root
# configuration touched beyond one sudoers file and one user (everything else lives under one
# directory and SLURM_CONF points at it). As strict as ParallelCluster where it matters (its
# slurm.conf values, its partition line, jobs of an unprivileged user with its sudo rule):
# see _slurm_common_conf and _slurm_setup_job_user.
#   start_slurm DIR            munged + slurmctld + slurmd with their config, state, logs and
#                              pid files under DIR; the job user and its sudoers file; exports
#                              SLURM_CONF and JUMBO_JOB_USER; returns once the node is idle
#                              (bounded). The node claims CPUs=8 whatever the machine has
#                              (and exports OMPI_MCA_mpi_yield_when_idle=1 for that reason).
#                              SLURM_TEST_CRED_EXPIRE: AuthInfo's cred_expire (default 70, as
#                              ParallelCluster's; tests that wait out requeues set 10).
#                              SLURM_TEST_KILL_WAIT: KillWait (default 30, as ParallelCluster's)
#   stop_slurm                 cancels every job of this cluster, kills what is left of them
#                              and the three daemons, by PID (TERM, then KILL), removes the
#                              sudoers file and DIR
#   as_job_user CMD...         runs CMD as the job user (sbatch, scancel: what a user runs)
#   job_user_dirs DIR...       creates DIRs owned by the job user (the "shared file system")
#   job_user_can_read PATH...  fails with one line naming the first PATH (or a parent) the job
#                              user cannot read: the checkout must be readable by others
#   job_user_test_dirs TMP REPO JUMBO   all of that for a test's temporary directory
#   wait_job JOBID STATE... TIMEOUT
#                              polls `scontrol show job` every 0.5 s until the job is in one of
#                              the STATEs; fails with the job's record and log on timeout or
#                              when it ends in a state not asked for
#   job_field JOBID FIELD      one field of `scontrol show job` (JobState, Restarts, ExitCode...)
#   slurm_logs                 the daemons' logs (for a test's failure message)
# Never `sbatch --wait`: it polls slowly (a 12 s job returns after ~40 s).
# Slurm 22.05 packages: slurmctld slurmd slurm-client munge, and sudo (scripts/install-deps.sh).

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

# The settings every test cluster shares (this one-node harness and slurm_multihost.sh).
# Where ParallelCluster's value changes what a job sees, it is taken from its template:
# aws-parallelcluster-cookbook (commit f75d84c), cookbooks/aws-parallelcluster-slurm/templates/
# default/slurm/slurm.conf.erb, lines 51-67: SlurmctldTimeout=300 SlurmdTimeout=180
# UnkillableStepTimeout=180 MinJobAge=300 KillWait=30 MessageTimeout=60 AuthInfo=cred_expire=70
# EnforcePartLimits=ALL ProctrackType=proctrack/cgroup ReturnToService=1
# TaskPlugin=task/affinity,task/cgroup; SelectTypeParameters=CR_CPU (files/default/
# head_node_slurm/slurm/templates/slurm_parallelcluster.conf line 14). Kept different, and why:
#  - cred_expire: also how long a requeued job waits before it may start again
#    ("Reason=BeginTime"); SLURM_TEST_CRED_EXPIRE, default 70 as ParallelCluster, and 10 in
#    the tests that wait out requeues (each requeue would add a minute). The scripts' comments
#    use ParallelCluster's 70.
#  - KillWait: 30 as ParallelCluster's, except in slurm.requeue (SLURM_TEST_KILL_WAIT=5), whose
#    killed-rank case would otherwise wait it out once; multihost_hostfail keeps 30 and bounds
#    its wait by the configured value.
#  - the controller and daemon timeouts (SlurmctldTimeout, SlurmdTimeout, MessageTimeout):
#    they decide only how soon a dead daemon is noticed, which the tests wait for.
#  - proctrack/linuxproc and task/none: no cgroups or systemd here.
#  - SlurmUser=root: the daemons run as root here (ParallelCluster: the slurm user). The jobs do
#    not: they run as JUMBO_JOB_USER (_slurm_setup_job_user).
# Prints slurm.conf lines; DIR holds munge's socket and the state.
_slurm_common_conf() {
  local dir=$1
  cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=${SLURM_TEST_CRED_EXPIRE:-70}
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
# ParallelCluster's: a job larger than its partition is refused at submission, not left pending.
EnforcePartLimits=ALL
ReturnToService=1
MaxArraySize=1001
MinJobAge=300
KillWait=${SLURM_TEST_KILL_WAIT:-30}
UnkillableStepTimeout=180
# Short: a test waits for them.
SlurmctldTimeout=10
MessageTimeout=10
InactiveLimit=0
SlurmdParameters=config_overrides
EOF
  : >"$dir/plugstack.conf"  # none of the system's SPANK plugins
}

# _slurm_partition NODES: the partition as ParallelCluster writes one per queue, a NodeSet
# and a partition of it with no node limit of its own (config_renderer.py lines 183-194 in
# the same commit): with EnforcePartLimits=ALL a job asking for more nodes than the queue
# has is refused by sbatch ("Node count specification invalid").
_slurm_partition() {
  echo "NodeSet=test_nodes Nodes=$1"
  echo "PartitionName=test Nodes=test_nodes MaxTime=INFINITE State=UP Default=YES"
}

# The job user: ParallelCluster's default user (ec2-user, ubuntu) is an ordinary user, not a
# Slurm operator; sudo works for it (NOPASSWD: ALL, the AMI's cloud-init rule) but with
# ParallelCluster's secure_path, which lacks /opt/slurm/bin, where scontrol is:
# aws-parallelcluster-cookbook f75d84c, cookbooks/aws-parallelcluster-platform/recipes/
# install/sudo_install.rb lines 24-34 (/usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin
# /bin /snap/bin, into /etc/sudoers.d/99-parallelcluster-secure-path). Debian's scontrol is
# in /usr/bin (and /bin links to it), so this user's secure_path lacks those two, as
# ParallelCluster's lacks /opt/slurm/bin: `sudo -n scontrol` fails as it would there.
# SLURM_CONF is kept through sudo only so that root's scontrol finds this test cluster (on
# ParallelCluster scontrol reads its built-in /opt/slurm/etc/slurm.conf).
JUMBO_JOB_USER=${JUMBO_JOB_USER:-jumbojob}
_slurm_setup_job_user() {
  local file=$1
  command -v sudo >/dev/null ||
    { _slurm_fail "sudo is not installed: run scripts/install-deps.sh"; return 1; }
  if ! id -u "$JUMBO_JOB_USER" >/dev/null 2>&1; then
    useradd --create-home --user-group --shell /bin/bash "$JUMBO_JOB_USER" ||
      { _slurm_fail "could not create the job user $JUMBO_JOB_USER"; return 1; }
  fi
  cat >"$file.new" <<EOF
# Written by tests/support/slurm_cluster.sh for one test cluster; removed by stop_slurm.
Defaults:$JUMBO_JOB_USER secure_path = /usr/local/sbin:/usr/local/bin:/usr/sbin:/sbin:/snap/bin
Defaults:$JUMBO_JOB_USER env_keep += "SLURM_CONF"
$JUMBO_JOB_USER ALL=(ALL) NOPASSWD: ALL
EOF
  chmod 440 "$file.new"
  visudo -cq -f "$file.new" || { rm -f "$file.new"; _slurm_fail "visudo refused $file"; return 1; }
  mv "$file.new" "$file"
  export JUMBO_JOB_USER
}

# _slurm_job_user_access DIR: the job user's way into the cluster's directory (its clients
# read slurm.conf and talk to munged's socket; the key stays root's) and its sudoers file,
# /etc/sudoers.d/jumbo-test-PID (sudo skips names with a dot), after removing those of
# test shells that are gone.
_slurm_job_user_access() {
  local dir=$1 f
  chmod 755 "$dir" && chmod 711 "$dir/munge" || return 1
  for f in /etc/sudoers.d/jumbo-test-*; do
    [[ -e $f && ! -e /proc/${f##*-} ]] && rm -f "$f"
  done
  SLURM_TEST_SUDOERS=/etc/sudoers.d/jumbo-test-$$
  _slurm_setup_job_user "$SLURM_TEST_SUDOERS"
}

_slurm_remove_sudoers() {
  [[ -n ${SLURM_TEST_SUDOERS:-} ]] && rm -f "$SLURM_TEST_SUDOERS" "$SLURM_TEST_SUDOERS.new"
  unset SLURM_TEST_SUDOERS
}

as_job_user() {
  local home
  home=$(getent passwd "$JUMBO_JOB_USER" | cut -d: -f6)
  HOME=$home USER=$JUMBO_JOB_USER LOGNAME=$JUMBO_JOB_USER \
    setpriv --reuid="$JUMBO_JOB_USER" --regid="$JUMBO_JOB_USER" --init-groups -- "$@"
}

job_user_dirs() {
  mkdir -p "$@" && chown "$JUMBO_JOB_USER:" "$@"
}

# job_user_test_dirs TMP REPO JUMBO: what a Slurm test does for its job user: TMP (mktemp's
# mode 0700) opened to it, the checkout and the binary checked readable, TMP/fsx (the shared
# file system) and TMP/logs (the job logs) its own.
job_user_test_dirs() {
  chmod 755 "$1" && job_user_can_read "$SLURM_CONF" "$2/slurm/common.sh" "$3" &&
    job_user_dirs "$1/fsx" "$1/logs"
}

job_user_can_read() {
  local path d part parts what
  for path in "$@"; do
    as_job_user test -r "$path" && continue
    what="$path itself is not readable by others"
    d=
    IFS=/ read -ra parts <<<"${path#/}"
    for part in "${parts[@]:0:${#parts[@]}-1}"; do
      d+=/$part
      as_job_user test -x "$d" || { what="$d is not searchable by others"; break; }
    done
    _slurm_fail "the job user $JUMBO_JOB_USER cannot read $path: $what (the checkout, the" \
      "build and the test's directories must be readable by others: chmod o+rx)"
    return 1
  done
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
EOF
    _slurm_partition "$host"
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
  _slurm_job_user_access "$dir" || { stop_slurm; return 1; }

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
  _slurm_remove_sudoers
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
