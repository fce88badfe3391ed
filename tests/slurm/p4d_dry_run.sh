#!/usr/bin/env bash
# The p4d job path without a GPU: slurm/train_jumbo.sh with inputs/runs/j1-jumbo.toml (train.device
# = "cuda", 8 ranks a node, EFA expected: the doctor's expectations on p4d) on a one-node Slurm
# started here, as strict as ParallelCluster (EnforcePartLimits=ALL, an unprivileged job user
# whose sudo secure_path lacks scontrol's directory: tests/support/slurm_cluster.sh). Checked:
#  - the partition limit: `sbatch slurm/train_jumbo.sh` is accepted on a one-node queue (the
#    script asks for no node count), `sbatch --nodes=2` is refused;
#  - the job, submitted by the job user with no --nodes, ends in `jumbo doctor`, FAILED with
#    exit 1 and not requeued, with one FAIL line each for the GPUs, NCCL and the NCCL network
#    plugin (and EFA, and this CPU build), the node drained for its node faults (GPUs, EFA) by
#    the job user (sudo with scontrol's absolute path), and never reaches `jumbo train`.
# The cleanup resumes the node, and the test checks that it did.
#
# This machine's ld.so.cache lists the CUDA toolkit's NCCL, which a node of ParallelCluster's AMI
# lacks: as root the test runs in a private mount namespace whose /etc/ld.so.cache leaves out the
# CUDA directories (slurmd and the job inherit it; nothing outside changes). Elsewhere the NCCL
# line may be "ok", naming the file it found.
# Usage: p4d_dry_run.sh JUMBO REPO
if [[ -z ${JUMBO_P4D_NAMESPACE:-} && $(id -u) == 0 ]] && command -v unshare >/dev/null &&
  unshare --mount true 2>/dev/null; then
  exec unshare --mount --propagation private env JUMBO_P4D_NAMESPACE=1 bash "$0" "$@"
fi
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
source tests/support/slurm_cluster.sh
node=$(hostname -s)
cleanup() {
  # Undo the drain before the cluster goes, and say so if that failed.
  if [[ -n ${SLURM_CONF:-} ]] && scontrol ping >/dev/null 2>&1; then
    scontrol update nodename="$node" state=resume 2>/dev/null
    local state
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null)
    [[ $state == drain* || $state == drng ]] && echo "FAIL: cleanup: node $node is still $state"
  fi
  stop_slurm
}
on_exit cleanup
# What a failure shows before the cleanup: the logs it needs.
failure_logs() {
  [[ -n ${log:-} && -f $log ]] && { echo "== $log"; tail -60 "$log"; }
}
on_failure failure_logs

nccl_hidden=0
if [[ -n ${JUMBO_P4D_NAMESPACE:-} ]]; then
  grep -hv '^#' /etc/ld.so.conf.d/*.conf 2>/dev/null | grep -vi 'cuda\|nccl' >"$tmp/ld.so.conf"
  ldconfig -C "$tmp/ld.so.cache" -f "$tmp/ld.so.conf" 2>/dev/null &&
    mount --bind "$tmp/ld.so.cache" /etc/ld.so.cache && nccl_hidden=1
fi

t0=$SECONDS
start_slurm "$tmp/slurm" || fail "could not start Slurm"
job_user_test_dirs "$tmp" "$repo" "$jumbo" || fail "the job user cannot use this checkout"
unset JUMBO_HOME JUMBO_RUN_DIR JUMBO_CKPT_DIR JUMBO_RUN_NAME JUMBO_LAUNCHER JUMBO_CONFIG \
  JUMBO_EXPECT_EFA JUMBO_EXPECT_GPUS JUMBO_DOCTOR JUMBO_DRAIN_BAD_NODES NCCL_NET_PLUGIN \
  FI_PROVIDER LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
export JUMBO=$jumbo JUMBO_ROOT=$tmp/fsx
# As on p4d: 8 ranks a node; the node has CPUs=8 and no GPU gres, so 1 CPU a rank and
# --gpus-per-node=0 (the doctor's 8 GPUs come from train.device = "cuda", one per rank). No
# --nodes: the node count is the script's (none: Slurm's one node) as `sbatch
# slurm/train_jumbo.sh` submits it.
p4d_args=(--ntasks-per-node=8 --cpus-per-task=1 --gpus-per-node=0 --time=30
  --output="$tmp/logs/%x-%j.out")
# One task a node, so that the node count alone is over the limit (not the CPUs).
out=$(as_job_user sbatch --test-only --nodes=2 "${p4d_args[@]}" --ntasks-per-node=1 \
  slurm/train_jumbo.sh 2>&1) &&
  fail "sbatch --nodes=2 was accepted on a one-node partition (EnforcePartLimits=ALL): $out"
[[ $out == *"Node count specification invalid"* ]] ||
  fail "sbatch --nodes=2 was refused, but not for the partition's size: $out"
id=$(as_job_user sbatch --parsable "${p4d_args[@]}" slurm/train_jumbo.sh) ||
  fail "sbatch slurm/train_jumbo.sh (no --nodes) was refused on a one-node partition"
log=$tmp/logs/j1-jumbo-$id.out
wait_job "$id" FAILED 60 || fail "job $id did not end FAILED"
[[ $(job_field "$id" ExitCode) == 1:0 ]] || fail "ExitCode $(job_field "$id" ExitCode), expected 1:0"
[[ $(job_field "$id" Restarts) == 0 ]] || fail "Restarts $(job_field "$id" Restarts), expected 0"

# expect_one PATTERN WHAT: exactly one line of the log matches.
expect_one() {
  local n
  n=$(grep -cE -- "$1" "$log")
  ((n == 1)) || fail "$2: expected one line matching '$1', got $n"
}
grep -qF -- "--expect-efa --expect-gpus 8 --dir $tmp/fsx/checkpoints/j1-jumbo" "$log" ||
  fail "the doctor did not run with p4d's expectations (--expect-efa --expect-gpus 8 --dir ...)"
expect_one '^0: FAIL  gpu        no NVIDIA driver \(libcuda\.so\.1 not found\); expected 8 GPUs$' "GPU"
if ((nccl_hidden)); then
  expect_one '^0: FAIL  nccl       libnccl\.so\.2 not found: searched LD_LIBRARY_PATH' "NCCL"
else
  expect_one '^0: (FAIL  nccl       libnccl\.so\.2 not found|ok    nccl       NCCL [0-9.]+ from /)' "NCCL"
fi
expect_one '^0: FAIL  nccl-net   NCCL_NET_PLUGIN unset: .* looks for libnccl-net\.so, not found: searched .*; NCCL would use its socket transport between nodes$' \
  "the NCCL net plugin"
expect_one '^0: FAIL  libfabric  .*(no efa|FI_PROVIDER=efa: no efa device)' "EFA"
expect_one '^0: FAIL  build      this jumbo was built without -DJUMBO_CUDA=ON' "the CPU build"
expect_one "^0: doctor: failed node=$node node-checks=libfabric,gpu software-checks=nccl(,nccl-net|-net),build\$" \
  "the failed-node line"
grep -q "jumbo-slurm: doctor: drained $node (reason: jumbo doctor (job $id): $node: libfabric,gpu)" "$log" ||
  fail "no drain line for $node (the job user $JUMBO_JOB_USER could not drain it?)"
[[ $(job_field "$id" UserId) == "$JUMBO_JOB_USER("* ]] || fail "job $id ran as $(job_field "$id" UserId)"
grep -q "jumbo-slurm: not requeued because jumbo doctor found software or settings missing" "$log" ||
  fail "no not-requeued decision line"
! grep -q "jumbo-slurm: launch:\|^step \|jumbo-slurm: layout:" "$log" || fail "the job went on past the doctor"
reason=$(sinfo -h -n "$node" -o '%t %E')
[[ $reason == drain*"jumbo doctor (job $id): $node: libfabric,gpu" ]] ||
  fail "node $node: expected drained with the doctor's reason, got '$reason'"
grep "jumbo-slurm: \(doctor\|not requeued\|EFA\)\|^0: FAIL" "$log"

scontrol update nodename="$node" state=resume || fail "scontrol update state=resume failed"
state=$(sinfo -h -n "$node" -o %t)
# "idle*": idle, slurmd not pinged since (the test cluster's slurmd is slow to answer then).
[[ $state == idle || $state == 'idle*' ]] || fail "node $node is '$state' after resume, expected idle"
echo "ok: sbatch --nodes=2 refused by the one-node partition, slurm/train_jumbo.sh accepted"
echo "ok: the p4d job of $JUMBO_JOB_USER stopped in the doctor (GPU, NCCL$( ((nccl_hidden)) || echo ' (present here)'), plugin, EFA," \
  "build), drained $node, not requeued, never trained; node resumed ($((SECONDS - t0)) s)"
finish
