# Sourced by test scripts (run as root, from the repository root): a Slurm cluster of several
# hosts on this one machine. Each host is a Linux network namespace plus a UTS namespace
# (its own host name, hostN, and address), joined to the others by a veth pair on a bridge,
# with its own slurmd (its own spool directory, pid file and log). slurmctld and munged run
# in the root namespace, slurmctld on the bridge's address; the hosts share the file system
# (no mount namespaces), so one munged socket and one job directory serve them all.
#
#   start_multihost DIR TAG [HOSTS [CPUS]]
#                       HOSTS hosts (default 2) named host1, host2, ... of CPUS CPUs each
#                       (default 4). Network names start with a prefix unique to this run,
#                       TAG plus a number (TAG: 1-6 letters; interface names have at most
#                       15 characters), on a /24 of 10.213.0.0/16 no other interface here
#                       uses, so runs at the same time (the same test twice, too) never
#                       collide. Leftovers of earlier runs with TAG whose shell is gone (one
#                       killed before its trap ran) are removed first.
#                       Exports SLURM_CONF, OMPI_MCA_plm_rsh_agent (a script that enters a
#                       host's namespaces, for mpirun --host host1,host2 outside Slurm),
#                       OMPI_MCA_{btl,oob}_tcp_if_include (the bridge's subnet), Open MPI's
#                       session and shared-memory directories under DIR, pml ob1 and btl
#                       self,vader,tcp; sets
#                       MULTIHOST_HOSTS, MULTIHOST_PREFIX, MULTIHOST_NET; the job user and
#                       its sudo rule as in slurm_cluster.sh; returns once every
#                       node is idle (bounded). MULTIHOST_SLURMD_TIMEOUT (default 30):
#                       slurm.conf's SlurmdTimeout.
#   stop_multihost      cancels the jobs, kills every process left in the hosts' namespaces
#                       and the daemons by PID, deletes the namespaces, veths and bridge,
#                       removes DIR; safe to call twice and from a trap
#   multihost_exec HOST CMD...    runs CMD on HOST (inside its namespaces)
#   multihost_cut HOST            takes HOST's link down (the host "goes away": packets to
#                                 and from it are dropped; its processes keep running)
#   multihost_restore HOST        brings the link back up
#   multihost_shape HOST RATE     limits HOST's link to RATE each way (tc tbf, e.g. 1gbit):
#                                 the slower inter-host level; off unless a script asks
#   multihost_unshape HOST        removes the limit
#   multihost_logs      the daemons' logs (for a failure message)
#   multihost_cleanup TAG         removes what runs with TAG left behind (their shell ended
#                                 without stop_multihost); start_multihost does it too
#   multihost_nodes_idle          every node idle in sinfo
# From tests/support/slurm_cluster.sh (sourced here): wait_job, job_field, as_job_user,
# job_user_dirs, job_user_can_read, _slurm_common_conf (ParallelCluster's values),
# _slurm_partition, _slurm_start_munge_and_ctld.

# shellcheck source=tests/support/slurm_cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_cluster.sh"

# Per run (MULTIHOST_PREFIX): owner (the shell's PID and start time), dir (DIR), net, the
# hosts' UTS namespace files. .lock serialises choosing a prefix and a subnet.
MULTIHOST_RUN_ROOT=/run/jumbo-multihost

_mh_fail() { echo "slurm_multihost: $*" >&2; return 1; }

_mh_netns() { echo "$MULTIHOST_PREFIX-$1"; }            # netns name of a host
_mh_uts() { echo "$MULTIHOST_RUN_ROOT/$MULTIHOST_PREFIX/$1.uts"; }
_mh_veth() { echo "${MULTIHOST_PREFIX}v${1#host}"; }    # root side of a host's veth

# _mh_start_time PID: the process's start time (clock ticks after boot), empty if none.
_mh_start_time() { sed -n 's/.*) //p' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }

# _mh_owner_alive RUNDIR: the shell that started that run is still running.
_mh_owner_alive() {
  local pid start
  read -r pid start <"$1/owner" 2>/dev/null || return 1
  [[ -n $pid && -n $start && $(_mh_start_time "$pid") == "$start" ]]
}

# _mh_kill_netns NETNS: every process in it, by PID (TERM, 2 s, KILL).
_mh_kill_netns() {
  local ns=$1 pids pid
  pids=$(ip netns pids "$ns" 2>/dev/null) || return 0
  [[ -n $pids ]] || return 0
  for pid in $pids; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 1 10); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [[ -z $pids ]] && return 0
    sleep 0.2
  done
  for pid in $pids; do kill -KILL "$pid" 2>/dev/null; done
  _slurm_wait_for 5 test -z "$(ip netns pids "$ns" 2>/dev/null)"
}

# _mh_remove_prefix PREFIX: whatever the run with PREFIX left: its daemons (pid files in the
# directory recorded under /run), the processes in its namespaces, the namespaces, bridge,
# UTS files, directories.
_mh_remove_prefix() {
  local prefix=$1 run=$MULTIHOST_RUN_ROOT/$1 ns f olddir=
  if [[ -f $run/dir ]]; then
    olddir=$(cat "$run/dir")
    _slurm_kill "$(_slurm_pid "$olddir/slurmctld.pid")" slurmctld
    _slurm_kill "$(_slurm_pid "$olddir/munge/munged.pid")" munged
  fi
  for ns in $(ip netns list 2>/dev/null | awk -v p="$prefix-host" 'index($1, p) == 1 {print $1}'); do
    _mh_kill_netns "$ns"
    ip netns delete "$ns" 2>/dev/null  # its veth end goes with it, and so the peer
  done
  for f in "$run"/*.uts; do
    [[ -e $f ]] || continue
    umount "$f" 2>/dev/null
    rm -f "$f"
  done
  ip link delete "${prefix}br" 2>/dev/null
  [[ -n $olddir && $olddir != "${MULTIHOST_DIR:-}" && -d $olddir ]] && rm -rf "$olddir"
  rm -rf "$run"
}

# _mh_remove_stale TAG: every run of TAG whose shell is gone.
_mh_remove_stale() {
  local run
  for run in "$MULTIHOST_RUN_ROOT/$1"*; do
    [[ -d $run && ${run##*/} =~ ^$1[0-9]+$ ]] || continue
    _mh_owner_alive "$run" && continue
    echo "slurm_multihost: removing ${run##*/}, left by an earlier run (owner $(cat "$run/owner" 2>/dev/null))" >&2
    _mh_remove_prefix "${run##*/}"
  done
}

multihost_cleanup() {
  mkdir -p "$MULTIHOST_RUN_ROOT"
  (flock 9; _mh_remove_stale "$1") 9>"$MULTIHOST_RUN_ROOT/.lock"
}

_mh_write_conf() {
  local dir=$1 ctld_host=$2 ctld_addr=$3 ctld_port=$4 cpus=$5 i
  {
    cat <<EOF
# Written by tests/support/slurm_multihost.sh: ${#MULTIHOST_HOSTS[@]} hosts, each a network +
# UTS namespace with its own slurmd; slurmctld on the bridge's address.
ClusterName=jumbomh
SlurmctldHost=$ctld_host($ctld_addr)
SlurmctldPort=$ctld_port
# Every host has its own network namespace: the same port on each.
SlurmdPort=6818
# %n: per host (NodeName), since the hosts share the file system.
SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmdLogFile=$dir/log/slurmd-%n.log
# Also per host: the pmix plugin's client directories (spmix_appdir_UID_JOB.STEP) would
# otherwise collide in the shared /tmp (both hosts run the same step).
TmpFS=$dir/tmp/%n
SlurmdTimeout=${MULTIHOST_SLURMD_TIMEOUT:-30}
EOF
    for ((i = 1; i <= ${#MULTIHOST_HOSTS[@]}; i++)); do
      echo "NodeName=host$i NodeAddr=$MULTIHOST_NET.$((10 + i)) CPUs=$cpus RealMemory=1000 State=UNKNOWN"
    done
    _slurm_partition "host[1-${#MULTIHOST_HOSTS[@]}]"
    _slurm_common_conf "$dir"
  } >"$dir/slurm.conf"
}

# The rsh agent Open MPI's mpirun uses for --host hostN outside Slurm: "AGENT [-opts] HOST CMD...",
# CMD being words for a remote shell (as ssh runs them).
_mh_write_agent() {
  local dir=$1
  cat >"$dir/bin/rsh-agent" <<EOF
#!/usr/bin/env bash
# Written by tests/support/slurm_multihost.sh: runs a command "on" a host of the test cluster.
while [[ \${1:-} == -* ]]; do shift; done
host=\${1#*@}
shift
[[ -e /run/netns/$MULTIHOST_PREFIX-\$host ]] || { echo "rsh-agent: no host \$host" >&2; exit 255; }
exec nsenter --net=/run/netns/$MULTIHOST_PREFIX-\$host --uts=$MULTIHOST_RUN_ROOT/$MULTIHOST_PREFIX/\$host.uts \\
  -- /bin/sh -c "\$*"
EOF
  chmod +x "$dir/bin/rsh-agent"
}

multihost_nodes_idle() {
  local states
  states=$(sinfo -h -N -o %t 2>/dev/null | sort -u)
  [[ $states == idle ]]
}

multihost_exec() {
  local host=$1
  shift
  nsenter --net="/run/netns/$(_mh_netns "$host")" --uts="$(_mh_uts "$host")" -- "$@"
}

# multihost_possible: whether this machine lets the harness make hosts (root, and network and
# UTS namespaces permitted: an unprivileged container refuses them). Says why not on stderr.
multihost_possible() {
  if ((EUID != 0)); then
    echo "slurm_multihost: needs root (network namespaces, veths, a bridge)" >&2
    return 1
  fi
  if ! unshare --net --uts true 2>/dev/null; then
    echo "slurm_multihost: this machine does not permit network and UTS namespaces" \
      "(unshare --net --uts: $(unshare --net --uts true 2>&1 | head -1))" >&2
    return 1
  fi
}

multihost_cut() { ip link set "$(_mh_veth "$1")" down; }
multihost_restore() { ip link set "$(_mh_veth "$1")" up; }

# multihost_shape HOST RATE: HOST's link limited to RATE (tc's units: kbit, mbit, gbit: 1gbit,
# 200mbit) each way, by a token bucket (tbf) on both ends of its veth: the root side (traffic
# to HOST) and HOST's eth0 (traffic from it). Ranks on one host keep shared memory; between
# hosts they get the slower level, as NVSwitch and EFA. No added delay: this kernel has no
# netem ("Specified qdisc kind is unknown"), so the latency is the veth's and TCP's own
# (tens of us, measured by jumbo bench comm). multihost_unshape HOST removes it.
# The bucket holds 256 us of RATE (at least 4 KiB): a bucket lets its size out at the veth's
# speed after a pause, so with 256 KiB a tp all-reduce that follows a layer's GEMMs crossed
# at memory speed, 1.4x faster than the back-to-back benchmark of the same link measured
# (the time model's check, tp across two hosts: 0.78 of the plan; 1.05 with this bucket).
# A real link does not refill while idle. (peakrate RATE shapes harder but, per packet, ran
# the link at a quarter of RATE.)
multihost_shape() {
  local host=$1 rate=$2 veth kbit
  veth=$(_mh_veth "$host")
  case $rate in
    *kbit) kbit=${rate%kbit} ;;
    *mbit) kbit=$((${rate%mbit} * 1000)) ;;
    *gbit) kbit=$((${rate%gbit} * 1000000)) ;;
  esac
  [[ ${kbit:-} =~ ^[0-9]+$ ]] ||
    _mh_fail "multihost_shape $host $rate: expected a whole number of kbit, mbit or gbit" || return 1
  local burst=$((kbit * 32 / 1000))
  ((burst >= 4096)) || burst=4096
  local args=(root tbf rate "$rate" burst "$burst" latency 50ms)
  tc qdisc replace dev "$veth" "${args[@]}" &&
    multihost_exec "$host" tc qdisc replace dev eth0 "${args[@]}"
}
multihost_unshape() {
  tc qdisc del dev "$(_mh_veth "$1")" root 2>/dev/null
  multihost_exec "$1" tc qdisc del dev eth0 root 2>/dev/null
  return 0
}

start_multihost() {
  local dir=$1 tag=$2 nhosts=${3:-2} cpus=${4:-4} prog i host ns uts veth addr ports
  for prog in munged slurmctld slurmd sbatch scontrol sinfo ip nsenter unshare; do
    command -v "$prog" >/dev/null ||
      _mh_fail "$prog is missing (Slurm: scripts/install-deps.sh; iproute2, util-linux)" || return 1
  done
  ((EUID == 0)) || _mh_fail "needs root (network namespaces)" || return 1
  [[ $tag =~ ^[a-z]{1,6}$ ]] || _mh_fail "TAG '$tag': 1-6 letters a-z" || return 1
  [[ -z ${MULTIHOST_DIR:-} ]] || _mh_fail "a cluster is already running in $MULTIHOST_DIR" ||
    return 1
  [[ -z ${SLURM_TEST_DIR:-} ]] || _mh_fail "a one-node cluster runs in $SLURM_TEST_DIR" || return 1
  mkdir -p "$dir" "$MULTIHOST_RUN_ROOT" && dir=$(cd "$dir" && pwd) || return 1
  MULTIHOST_DIR=$dir
  MULTIHOST_TAG=$tag
  MULTIHOST_PREFIX=
  MULTIHOST_HOSTS=()
  for ((i = 1; i <= nhosts; i++)); do MULTIHOST_HOSTS+=("host$i"); done
  mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" "$dir/run" "$dir/bin" ||
    { stop_multihost; return 1; }
  _slurm_job_user_access "$dir" || { stop_multihost; return 1; }

  # Under the lock: remove stale runs of TAG, take the first free PREFIX = TAG + number and
  # the first /24 no interface uses, and create the bridge with its address (which claims it).
  local lock n x used
  exec {lock}>"$MULTIHOST_RUN_ROOT/.lock"
  flock "$lock"
  _mh_remove_stale "$tag"
  for ((n = 1; n < 100; n++)); do
    [[ -e $MULTIHOST_RUN_ROOT/$tag$n || -e /run/netns/$tag$n-host1 ]] && continue
    ip link show "$tag${n}br" >/dev/null 2>&1 && continue
    # A host's veth can outlive its run while something still holds the namespace open.
    ip link show "$tag${n}v1" >/dev/null 2>&1 && continue
    MULTIHOST_PREFIX=$tag$n
    break
  done
  used=$(ip -o -4 addr show 2>/dev/null | awk '{print $4}')
  MULTIHOST_NET=
  for ((x = 20; x < 250; x++)); do
    grep -q "^10\.213\.$x\." <<<"$used" && continue
    MULTIHOST_NET=10.213.$x
    break
  done
  if [[ -z $MULTIHOST_PREFIX || -z $MULTIHOST_NET ]]; then
    flock -u "$lock"; exec {lock}>&-
    _mh_fail "no free prefix (${tag}1..99) or subnet (10.213.20-249.0/24) here"; stop_multihost
    return 1
  fi
  mkdir -p "$MULTIHOST_RUN_ROOT/$MULTIHOST_PREFIX"
  echo "$$ $(_mh_start_time $$)" >"$MULTIHOST_RUN_ROOT/$MULTIHOST_PREFIX/owner"
  echo "$dir" >"$MULTIHOST_RUN_ROOT/$MULTIHOST_PREFIX/dir"
  echo "$MULTIHOST_NET.0/24" >"$MULTIHOST_RUN_ROOT/$MULTIHOST_PREFIX/net"
  # The network: a bridge with the controller's address, a veth per host.
  local br=${MULTIHOST_PREFIX}br
  { ip link add "$br" type bridge && ip addr add "$MULTIHOST_NET.1/24" dev "$br" &&
    ip link set "$br" up; } 
  i=$?
  flock -u "$lock"; exec {lock}>&-
  ((i == 0)) || { _mh_fail "could not create bridge $br"; stop_multihost; return 1; }
  for host in "${MULTIHOST_HOSTS[@]}"; do
    ns=$(_mh_netns "$host") uts=$(_mh_uts "$host") veth=$(_mh_veth "$host")
    addr=$MULTIHOST_NET.$((10 + ${host#host}))
    { ip netns add "$ns" &&
      ip link add "$veth" type veth peer name eth0 netns "$ns" &&
      ip link set "$veth" master "$br" && ip link set "$veth" up &&
      ip -n "$ns" addr add "$addr/24" dev eth0 && ip -n "$ns" link set eth0 up &&
      ip -n "$ns" link set lo up &&
      touch "$uts" && unshare --uts="$uts" hostname "$host" &&
      mkdir -p "$dir/spool/$host" "$dir/tmp/$host" && chmod 1777 "$dir/tmp/$host"; } ||
      { _mh_fail "could not create host $host ($ns, $addr)"; stop_multihost; return 1; }
  done

  ports=$(_slurm_free_ports) || { _mh_fail "no free port"; stop_multihost; return 1; }
  _mh_write_conf "$dir" "$(hostname -s)" "$MULTIHOST_NET.1" "${ports%% *}" "$cpus"
  _mh_write_agent "$dir"
  export SLURM_CONF=$dir/slurm.conf
  export OMPI_MCA_mpi_yield_when_idle=1  # the hosts claim more CPUs than the machine has
  # Each host's mpirun daemon binds its first rank to core 0, its second to core 1, ...: on
  # hosts that share this machine's cores, every host's rank 0 would share core 0.
  export OMPI_MCA_hwloc_base_binding_policy=none
  export OMPI_MCA_plm_rsh_agent=$dir/bin/rsh-agent
  export OMPI_MCA_btl_tcp_if_include=$MULTIHOST_NET.0/24
  export OMPI_MCA_oob_tcp_if_include=$MULTIHOST_NET.0/24
  # Open MPI names its session directory and shared-memory segments by host name and job id
  # (from Slurm's job and step): two clusters at once both have host1 running job 1. Per run,
  # then; and shared memory within a host, TCP between hosts, nothing else probed (PSM, UCX).
  # Written by the job user's ranks too.
  mkdir -p "$dir/ompi" && chmod 1777 "$dir/ompi"
  export OMPI_MCA_orte_tmpdir_base=$dir/ompi OMPI_MCA_btl_vader_backing_directory=$dir/ompi
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp

  _slurm_start_munge_and_ctld "$dir" || { stop_multihost; return 1; }
  for host in "${MULTIHOST_HOSTS[@]}"; do
    # -N: this slurmd is that node of slurm.conf (its UTS host name says the same).
    multihost_exec "$host" slurmd -N "$host" >"$dir/log/slurmd-$host.out" 2>&1 ||
      { cat "$dir/log/slurmd-$host.out" >&2; multihost_logs >&2; stop_multihost; return 1; }
  done
  _slurm_wait_for 30 multihost_nodes_idle ||
    { _mh_fail "nodes not idle after 30 s"; sinfo -N -l >&2; multihost_logs >&2
      stop_multihost; return 1; }
}

multihost_logs() {
  local f
  for f in "$MULTIHOST_DIR"/log/slurmctld.log "$MULTIHOST_DIR"/log/slurmd-*.log; do
    [[ -f $f ]] && { echo "== $f (last 30 lines)"; tail -30 "$f"; }
  done
}

stop_multihost() {
  local dir=${MULTIHOST_DIR:-} prefix=${MULTIHOST_PREFIX:-} host jobs
  [[ -n $dir ]] || return 0
  if [[ -n ${SLURM_CONF:-} ]] && scontrol ping >/dev/null 2>&1; then
    mapfile -t jobs < <(squeue -h -o %A 2>/dev/null | sort -u)
    ((${#jobs[@]} == 0)) || scancel --full "${jobs[@]}" 2>/dev/null
    # A host that was cut cannot report its jobs' end: bring links up first.
    for host in "${MULTIHOST_HOSTS[@]}"; do multihost_restore "$host" 2>/dev/null; done
    _slurm_wait_for 15 _slurm_no_running_jobs
  fi
  for host in "${MULTIHOST_HOSTS[@]}"; do
    _slurm_kill "$(_slurm_pid "$dir/run/slurmd-$host.pid")" slurmd
    # slurmstepd, ranks, orted: whatever is left in the host
    [[ -n $prefix ]] && _mh_kill_netns "$(_mh_netns "$host")"
  done
  _slurm_kill "$(_slurm_pid "$dir/slurmctld.pid")" slurmctld
  _slurm_kill "$(_slurm_pid "$dir/munge/munged.pid")" munged
  [[ -n $prefix ]] && _mh_remove_prefix "$prefix"
  _slurm_remove_sudoers
  unset MULTIHOST_DIR MULTIHOST_PREFIX SLURM_CONF OMPI_MCA_plm_rsh_agent \
    OMPI_MCA_btl_tcp_if_include OMPI_MCA_oob_tcp_if_include OMPI_MCA_orte_tmpdir_base \
    OMPI_MCA_btl_vader_backing_directory OMPI_MCA_pml OMPI_MCA_btl
  rm -rf "$dir"
}
