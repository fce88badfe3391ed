#!/usr/bin/env bash
#SBATCH --job-name=jumbo-preflight
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --exclusive
#SBATCH --time=00:30:00
#SBATCH --output=logs/%x-%j.out
#
# The first job on a new cluster, before slurm/train_jumbo.sh: the allocation the run will
# get, checked in three stages, then one table. As AI21's team did before J1's real run
# (performance and scaling across nodes first, then the full-size model briefly):
#   1. doctor      `jumbo doctor` on every node (slurm/doctor.sh's jumbo_run_doctor, the same
#                  step train_jumbo.sh runs; a node at fault is drained, never requeued here)
#   2. nccl-tests  all_reduce_perf across every GPU of the job, its largest size's bus
#                  bandwidth against a floor per instance type (below)
#   3. comm        `jumbo bench comm` of the layout `jumbo plan --best` picks for this
#                  allocation (slurm/common.sh's jumbo_choose_layout, as training does) on
#                  every rank: its tp, dp and pp groups and the world, in and across nodes,
#                  with jumbo's own collectives (NCCL on GPUs), and every rank's compute
#                  rates, written as a machine description, RUN_DIR/machine.toml
#                  (docs/plan.md "Machine descriptions"). JUMBO_MACHINE=that file makes
#                  train_jumbo.sh's `jumbo plan` choose the layout on these measurements
#   4. bench       `jumbo bench train --config CONFIG` of the run's own config and that
#                  layout on every rank, a few steps on synthetic tokens (no data, no
#                  checkpoint): the measured step time against the plan's estimate on the
#                  measured machine (on the GPU's data sheet if the comm stage failed), on
#                  one machine-readable line
#                  "preflight: step measured=S plan=S ratio=R layout=tp8,pp16,... device=..."
# The job exits 0 when every stage passed or was skipped, 1 naming the stages that failed,
# 2 for a mistake in the input (the config, the arguments, JUMBO_*).
#
#   mkdir -p logs
#   sbatch --nodes=64 slurm/preflight.sh         # the node count the run will get
#   sbatch --nodes=128 slurm/preflight.sh --set train.lr=1e-4   # arguments as train_jumbo.sh
#   grep '^preflight:' logs/jumbo-preflight-JOBID.out
# The node count is given to sbatch, as for train_jumbo.sh (which says why: ParallelCluster's
# EnforcePartLimits=ALL refuses a default larger than the queue).
#
# nccl-tests (github.com/NVIDIA/nccl-tests) is built once on the head node, in a directory
# the compute nodes share (ParallelCluster exports /home from the head node), against the
# MPI, CUDA and NCCL the cluster's AMI carries (the ParallelCluster DLAMI: /opt/amazon/openmpi,
# /usr/local/cuda, NCCL under /opt/nccl/build or CUDA's lib64):
#   git clone https://github.com/NVIDIA/nccl-tests ~/nccl-tests && cd ~/nccl-tests
#   make -j MPI=1 MPI_HOME=/opt/amazon/openmpi CUDA_HOME=/usr/local/cuda NCCL_HOME=/opt/nccl/build
# MPI=1 makes one process per GPU (-g 1) started by srun --mpi=pmix or mpirun, as jumbo's ranks.
#
# Environment (besides everything slurm/train_jumbo.sh reads: JUMBO, JUMBO_CONFIG, JUMBO_ROOT,
# JUMBO_RUN_NAME, JUMBO_LAUNCHER, JUMBO_EXPECT_EFA, JUMBO_DOCTOR, JUMBO_GPU, ...):
#   JUMBO_NCCL_TESTS      the all_reduce_perf binary; default ~/nccl-tests/build/all_reduce_perf;
#                         "none" skips the stage. On GPU nodes a missing binary fails the
#                         stage; on nodes without a GPU (the CPU form) the stage is skipped.
#   JUMBO_NCCL_TESTS_ARGS all_reduce_perf's options; default "-b 8 -e 8G -f 2 -g 1"
#   JUMBO_NCCL_TESTS_TIMEOUT  seconds; default 600
#   JUMBO_INSTANCE_TYPE   the EC2 instance type for the floor; default from the instance
#                         metadata service (IMDSv2), else unknown (no floor: reported only)
#   JUMBO_BUSBW_FLOOR     GB/s; replaces the floor of the instance type
#   JUMBO_COMM_MAX_BYTES  the largest size of the comm stage; default 1 GiB on GPUs (the
#                         sizes of the dp buckets and tp activations of J1-Jumbo), 16 MiB on
#                         CPU ranks
#   JUMBO_COMM_TIMEOUT    seconds for the comm stage; default 900
#   JUMBO_PREFLIGHT_STEPS timed steps of the bench (after 1 untimed); default 3
#   JUMBO_PREFLIGHT_TIMEOUT  seconds for the bench; default 1800
#
# The bus-bandwidth floors (GB/s, nccl-tests' busbw of the largest size: its column layout is
# nccl-tests' src/util.cu writeBenchmarkLinePreamble/Body at a0b82b2, src/common.cu before
# 2025-11, e.g. v2.13.9 lines 602 and 1056). Half of a published inter-node figure: low enough
# for any healthy allocation size (busbw falls with node count), high enough that NCCL on
# sockets (a few GB/s) or half the EFA links down fails.
#   p4d.24xlarge, p4de.24xlarge (4 x 100 Gbps EFA, 50 GB/s per node): 28.6 = 0.5 x 57.2 GB/s,
#     all_reduce_perf of 1 GiB on 2 x p4dn.24xlarge, the same 4 x 100 Gbps EFA (NVIDIA/nccl
#     issue 527, 2022-07-25; 29.6 GB/s on 4 nodes there).
#   p5.48xlarge, p5e.48xlarge, p5en.48xlarge (32 x 100 Gbps = 3200 Gbps, 400 GB/s per node):
#     62.5 = 0.5 x 125 GB/s, the "Avg bus bandwidth" AWS expects of 2 x p5.48xlarge
#     (aws/aws-k8s-tester pull request 503, 2024-11-05: "Shouldn't this be 124-125+?"). An
#     average over the size sweep is below its largest size's busbw: a conservative floor.
set -uo pipefail

# jumbo_nccl_tests_parse FILE: all_reduce_perf's output (its rows may carry srun --label's
# "N: " or mpirun --tag-output's "[1,0]<stdout>:" prefix) as one line
#   "avg=GBPS size=BYTES busbw=GBPS busbw_inplace=GBPS rows=N"
# (avg: the "# Avg bus bandwidth" line, "na" if absent; the rest: the largest size's row);
# status 1 when it holds no result row. A row is size, count, type, redop, [root (since
# nccl-tests 2.10)], then out-of-place time, algbw, busbw, #wrong and in-place the same.
jumbo_nccl_tests_parse() {
  awk '
    { sub(/^\[[0-9,]+\]<std(out|err)>: ?/, ""); sub(/^[0-9]+: /, "") }
    /^# *Avg bus bandwidth *:/ { avg = $0; sub(/^[^:]*: */, "", avg); sub(/ .*/, "", avg) }
    $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && $3 ~ /^[a-z0-9_]+$/ && NF >= 12 {
      body = ($5 ~ /^-?[0-9]+$/ && NF >= 13) ? 6 : 5
      if (rows == 0 || $1 + 0 >= size + 0) {
        size = $1; bw = $(body + 2); bw_in = $(body + 6)
      }
      rows++
    }
    END {
      if (!rows) exit 1
      printf "avg=%s size=%s busbw=%s busbw_inplace=%s rows=%d\n", avg == "" ? "na" : avg, size, bw, bw_in, rows
    }' "$1"
}

# jumbo_busbw_floor INSTANCE_TYPE: "GBPS SOURCE" (the header above), nothing if none is known.
jumbo_busbw_floor() {
  case $1 in
    p4d.24xlarge | p4de.24xlarge) echo "28.6 0.5x57.2GB/s(NVIDIA/nccl#527,2xp4dn,1GiB)" ;;
    p5.48xlarge | p5e.48xlarge | p5en.48xlarge) echo "62.5 0.5x125GB/s(aws/aws-k8s-tester#503,2xp5)" ;;
  esac
}

# The EC2 instance type of this node: JUMBO_INSTANCE_TYPE, else IMDSv2 (a token, then the
# instance-type; 2 s each), else "unknown".
jumbo_instance_type() {
  [[ -n ${JUMBO_INSTANCE_TYPE:-} ]] && { echo "$JUMBO_INSTANCE_TYPE"; return; }
  local token type
  token=$(curl -sf -m 2 -X PUT http://169.254.169.254/latest/api/token \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' 2>/dev/null) &&
    type=$(curl -sf -m 2 -H "X-aws-ec2-metadata-token: $token" \
      http://169.254.169.254/latest/meta-data/instance-type 2>/dev/null)
  echo "${type:-unknown}"
}

# Stage results for the table: PF_RESULT[stage] = pass, fail or skipped; PF_NUMBERS[stage].
declare -A PF_RESULT=() PF_NUMBERS=()
PF_STAGES=(doctor nccl-tests comm bench)
pf_set() { PF_RESULT[$1]=$2; PF_NUMBERS[$1]=${*:3}; jumbo_log "preflight: $1: $2: ${*:3}"; }

# The table, the last lines of the job. Runs as slurm/common.sh's jumbo_final_hook, so that a
# stage that ends the job through jumbo_exit (the doctor, an input mistake) still prints it.
jumbo_final_hook() {
  local s failed=()
  printf 'preflight: %-11s %-8s %s\n' stage result numbers
  for s in "${PF_STAGES[@]}"; do
    printf 'preflight: %-11s %-8s %s\n' "$s" "${PF_RESULT[$s]:-skipped}" \
      "${PF_NUMBERS[$s]:-not run: the job ended before it (above)}"
    [[ ${PF_RESULT[$s]:-} == fail ]] && failed+=("$s")
  done
  if ((${#failed[@]})); then
    printf 'preflight: FAILED: %s (exit %s)\n' "${failed[*]}" "$JUMBO_RC"
  elif ((JUMBO_RC != 0)); then
    printf 'preflight: FAILED: the job ended with exit %s before its stages ran (above)\n' "$JUMBO_RC"
  else
    printf 'preflight: passed: every stage passed or was skipped\n'
  fi
}

pf_doctor() {
  if [[ $JUMBO_DOCTOR != 1 ]]; then
    pf_set doctor skipped "JUMBO_DOCTOR=0"
    return
  fi
  # jumbo_run_doctor returns only when every node passed; otherwise it drains the nodes at
  # fault and ends the job with jumbo_exit (JUMBO_MAX_FAILURES=0: a preflight never requeues).
  PF_RESULT[doctor]=fail
  PF_NUMBERS[doctor]="a node failed (the doctor: lines above name it; drained if at fault)"
  jumbo_run_doctor
  pf_set doctor pass "every node passed (${SLURM_NNODES:-1} nodes, ${SLURM_JOB_NODELIST:-?})"
}

pf_nccl_tests() {
  local bin=${JUMBO_NCCL_TESTS:-$HOME/nccl-tests/build/all_reduce_perf} gpus nodes=${SLURM_NNODES:-1}
  local per_node=${SLURM_NTASKS_PER_NODE:-$((${SLURM_NTASKS:-1} / nodes))} ntasks cmd out rc
  local parsed itype floor source busbw extra
  if [[ $bin == none ]]; then
    pf_set nccl-tests skipped "JUMBO_NCCL_TESTS=none"
    return
  fi
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if ((gpus == 0)); then
    pf_set nccl-tests skipped "no GPU on $(hostname) (nvidia-smi lists none): the CPU form runs no all_reduce_perf"
    return
  fi
  if [[ ! -x $bin ]]; then
    pf_set nccl-tests fail "no all_reduce_perf at $bin: build nccl-tests on the head node" \
      "(slurm/preflight.sh's header) or set JUMBO_NCCL_TESTS"
    return
  fi
  ((nodes >= 2)) || { pf_set nccl-tests skipped "one node: no all-reduce between nodes"; return; }
  # One process per GPU, as jumbo's ranks: the job's ranks per node, at most the node's GPUs.
  ((per_node > gpus)) && per_node=$gpus
  ntasks=$((nodes * per_node))
  mapfile -t cmd < <(jumbo_launcher_cmd "$per_node" "$nodes" "$ntasks")
  read -ra extra <<<"${JUMBO_NCCL_TESTS_ARGS:--b 8 -e 8G -f 2 -g 1}"
  out=$(mktemp "${TMPDIR:-/tmp}/jumbo-nccl-tests.XXXXXX")
  jumbo_log "preflight: nccl-tests: ${cmd[*]} $bin ${extra[*]}"
  timeout "${JUMBO_NCCL_TESTS_TIMEOUT:-600}" "${cmd[@]}" "$bin" "${extra[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  parsed=$(jumbo_nccl_tests_parse "$out")
  rm -f "$out"
  if ((rc != 0)) || [[ -z $parsed ]]; then
    pf_set nccl-tests fail "all_reduce_perf on $ntasks GPUs exited $rc${parsed:+ ($parsed)}${parsed:- with no result row}"
    return
  fi
  itype=$(jumbo_instance_type)
  read -r floor source <<<"$(jumbo_busbw_floor "$itype")"
  [[ -n ${JUMBO_BUSBW_FLOOR:-} ]] && floor=$JUMBO_BUSBW_FLOOR source=JUMBO_BUSBW_FLOOR
  busbw=$(sed 's/.* busbw=\([^ ]*\).*/\1/' <<<"$parsed")
  if [[ -z ${floor:-} ]]; then
    pf_set nccl-tests pass "$parsed gpus=$ntasks instance=$itype floor=none (no figure for" \
      "this instance type: set JUMBO_BUSBW_FLOOR)"
  elif awk -v b="$busbw" -v f="$floor" 'BEGIN { exit !(b + 0 >= f + 0) }'; then
    pf_set nccl-tests pass "$parsed gpus=$ntasks instance=$itype floor=$floor $source"
  else
    pf_set nccl-tests fail "$parsed gpus=$ntasks instance=$itype: busbw $busbw GB/s is below" \
      "the floor $floor GB/s $source (NCCL on sockets? an EFA link down? NCCL_DEBUG=INFO says)"
  fi
}

# The plan's layout for this allocation, or the config's (as training). No layout that fits
# ends the job here (jumbo_fail_input, exit 2), with the stages that need it named in the table.
pf_layout() {
  local s
  for s in comm bench; do
    PF_RESULT[$s]=fail PF_NUMBERS[$s]="no layout (the jumbo-slurm: line above says why)"
  done
  jumbo_choose_layout
  unset 'PF_RESULT[comm]' 'PF_NUMBERS[comm]' 'PF_RESULT[bench]' 'PF_NUMBERS[bench]'
}

# pf_comm_summary FILE: from jumbo bench comm's JSON line (its last line starting with "{"),
# the world's all_reduce at the largest size, "world all_reduce BYTES B busbw=X GB/s ", the
# number nccl-tests' stage reports; nothing when the line or the row is missing.
pf_comm_summary() {
  grep '^{' "$1" | tail -1 | python3 -c '
import json, sys
try:
    rows = [r for r in json.load(sys.stdin)["rows"]
            if r["group"] == "world" and r["op"] == "all_reduce" and r["path"] == "blocking"]
except ValueError:
    rows = []
if rows:
    size, busbw = rows[-1]["bytes"], rows[-1]["busbw"] / 1e9
    print(f"world all_reduce {size} B busbw={busbw:.2f} GB/s ", end="")
' 2>/dev/null
}

# The machine description this job measured (the comm stage), empty until it has.
PF_MACHINE=
pf_comm() {
  local nodes=${SLURM_NNODES:-1} tp pp device max cmd out rc wrote busbw
  tp=$(jumbo_config_value parallel.tp)
  pp=$(jumbo_config_value parallel.pp)
  device=$(jumbo_config_value train.device)
  max=${JUMBO_COMM_MAX_BYTES:-$([[ $device == cuda ]] && echo 1073741824 || echo 16777216)}
  local machine=$JUMBO_RUN_DIR/machine.toml
  local args=(bench comm --tp "${tp:-1}" --pp "${pp:-1}" --device "${device:-cpu}"
    --max-bytes "$max" --write-machine "$machine")
  mapfile -t cmd < <(jumbo_launcher_cmd "${SLURM_NTASKS_PER_NODE:-}" "$nodes" "${SLURM_NTASKS:-1}")
  out=$(mktemp "${TMPDIR:-/tmp}/jumbo-comm.XXXXXX")
  jumbo_log "preflight: comm: ${cmd[*]} $JUMBO ${args[*]}"
  rm -f "$machine"
  timeout "${JUMBO_COMM_TIMEOUT:-900}" "${cmd[@]}" "$JUMBO" "${args[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  wrote=$(grep -m1 -o '^wrote .*' "$out")
  busbw=$(pf_comm_summary "$out")
  rm -f "$out"
  if ((rc != 0)) || [[ ! -s $machine ]]; then
    pf_set comm fail "jumbo bench comm exited $rc (the lines above say why)"
    return
  fi
  PF_MACHINE=$machine
  pf_set comm pass "${busbw}machine=$machine (JUMBO_MACHINE=$machine: the plan uses it;" \
    "${wrote#wrote "$machine": })"
}

pf_bench() {
  local nodes=${SLURM_NNODES:-1} per_node cmd out rc line args
  per_node=${SLURM_NTASKS_PER_NODE:-$((${SLURM_NTASKS:-1} / nodes))}
  jumbo_train_args "$@"
  # `jumbo bench train` takes train's arguments: the config, the job's and the plan's --set,
  # the user's; then the steps and the plan's request for the estimate: the machine the comm
  # stage measured, else the GPU's data sheet.
  args=(bench "${JUMBO_TRAIN_ARGS[@]}" --steps "${JUMBO_PREFLIGHT_STEPS:-3}" --warmup 1
    --nodes "$nodes" --gpus-per-node "$per_node" ${JUMBO_GPU:+--gpu "$JUMBO_GPU"}
    ${PF_MACHINE:+--machine "$PF_MACHINE"})
  mapfile -t cmd < <(jumbo_launcher_cmd "${SLURM_NTASKS_PER_NODE:-}" "$nodes" "${SLURM_NTASKS:-1}")
  out=$(mktemp "${TMPDIR:-/tmp}/jumbo-bench.XXXXXX")
  jumbo_log "preflight: bench: ${cmd[*]} $JUMBO ${args[*]}"
  timeout "${JUMBO_PREFLIGHT_TIMEOUT:-1800}" "${cmd[@]}" "$JUMBO" "${args[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  line=$(grep -m1 -o 'preflight: step measured=.*' "$out")
  rm -f "$out"
  if ((rc != 0)) || [[ -z $line ]]; then
    pf_set bench fail "jumbo bench train exited $rc (the lines above say why)"
  else
    pf_set bench pass "${line#preflight: step }"
  fi
}

jumbo_preflight_main() {
  local home=${JUMBO_HOME:-} cmd
  if [[ -z $home ]]; then
    cmd=$(scontrol show job -o "${SLURM_JOB_ID:-0}" 2>/dev/null | sed -n 's/.* Command=\([^ ]*\).*/\1/p')
    for home in "${cmd:+$(dirname "$cmd")/..}" "$(dirname "${BASH_SOURCE[0]}")/.." "${SLURM_SUBMIT_DIR:-.}"; do
      [[ -n $home && -f $home/slurm/common.sh ]] && break
    done
  fi
  # shellcheck source=slurm/common.sh
  source "$home/slurm/common.sh" 2>/dev/null || {
    echo "preflight: FAILED: slurm/common.sh is not under '$home': set JUMBO_HOME to the" \
      "repository, or submit from its root"
    exit 2
  }
  JUMBO_HOME=$(cd "$home" && pwd)
  # A preflight reports; it never requeues itself (the doctor's requeue after a drain needs
  # a failure budget: none). JUMBO_MAX_RESTARTS is the old name, still read by common.sh.
  JUMBO_MAX_FAILURES=0 JUMBO_MAX_RESTARTS=0
  jumbo_defaults j1-jumbo inputs/runs/j1-jumbo.toml
  cd "$JUMBO_HOME" || jumbo_fail_input "JUMBO_HOME=$JUMBO_HOME is not a directory"
  jumbo_check_inputs
  local v
  for v in JUMBO_PREFLIGHT_STEPS JUMBO_PREFLIGHT_TIMEOUT JUMBO_NCCL_TESTS_TIMEOUT \
    JUMBO_COMM_MAX_BYTES JUMBO_COMM_TIMEOUT; do
    [[ ${!v:-1} =~ ^[1-9][0-9]*$ ]] || jumbo_fail_input "$v=${!v}: expected a whole number >= 1"
  done
  [[ -z ${JUMBO_BUSBW_FLOOR:-} || $JUMBO_BUSBW_FLOOR =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
    jumbo_fail_input "JUMBO_BUSBW_FLOOR=$JUMBO_BUSBW_FLOOR: expected GB/s, e.g. 28.6"
  jumbo_print_job
  jumbo_prepare_dirs
  jumbo_efa_env
  jumbo_job_sets
  jumbo_collect_user_sets "$@"
  jumbo_check_config
  pf_doctor
  pf_nccl_tests
  pf_layout
  pf_comm
  pf_bench "$@"
  local s
  for s in "${PF_STAGES[@]}"; do
    [[ ${PF_RESULT[$s]:-} == fail ]] && { JUMBO_DECISION=failed; jumbo_exit 1; }
  done
  JUMBO_DECISION=finished
  jumbo_exit 0
}

# Sourced (tests/slurm/preflight.sh tests the parser): the functions only.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then jumbo_preflight_main "$@"; fi
