#!/usr/bin/env bash
#SBATCH --job-name=j1-large
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --exclusive
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@600
#SBATCH --time=24:00:00
#SBATCH --output=logs/%x-%j.out
#
# J1-Large (7.5B) training as one Slurm batch job on p4d.24xlarge nodes (8 x A100 40GB,
# NVSwitch, 4 x 100 Gbps EFA): one rank per GPU, 12 of the node's 96 vCPUs each.
#
#   mkdir -p logs          # Slurm does not create the --output directory: without it the
#                          # job fails at once (ExitCode 0:53) and leaves no log at all
#   sbatch --nodes=4 slurm/train_large.sh                       # from the repository root
#   sbatch --nodes=8 slurm/train_large.sh --set train.lr=1e-4
#
# The node count is always given to sbatch: the script asks for none, because ParallelCluster
# sets EnforcePartLimits=ALL (aws-parallelcluster-cookbook, cookbooks/aws-parallelcluster-slurm/
# templates/default/slurm/slurm.conf.erb line 62), so a default larger than the queue would make
# sbatch refuse the job outright ("Node count specification invalid"). Without --nodes Slurm
# gives one node; if no layout of the model fits it, the job ends at once (exit 2) naming the
# partition's node count.
#
# Arguments after the script go to `jumbo train`, after the job's own --set arguments, so
# they win (e.g. `--set train.lr=1e-4`, `--set checkpoint.every=200`). Setting
# parallel.tp/pp/micro_batch there also turns off the layout from `jumbo plan`.
#
# The #SBATCH lines are defaults; sbatch options on the command line override them.
# Stopping by hand with a save and a requeue: `scancel -b -s USR1 JOBID` (what the time
#   limit does, below). A plain `scancel JOBID` sends SIGTERM: jumbo tries to save, but Slurm
#   kills the job KillWait seconds later (30 s, ParallelCluster's and Slurm's default), which is
#   too short for a checkpoint of this size, and a cancelled job is never requeued.
# --signal=B:USR1@600: 10 minutes before the time limit Slurm sends SIGUSR1 to this batch
#   shell only ("B:"). The shell forwards it to the launcher, which passes it on to every
#   rank: jumbo finishes the step, saves a checkpoint and exits 75, and the job requeues
#   itself. Without "B:" Slurm signals the job steps instead: under srun that reaches the
#   ranks, but under the mpirun fallback the step's tasks are Open MPI's daemons (orted),
#   not the ranks and not mpirun; and the batch shell would not know a stop was asked for. 10 minutes covers the step in flight
#   plus a checkpoint (7.5B parameters: ~110 GB of shards with Adam state) to FSx.
# --output without --error: stderr goes to the same file, in order with stdout. (An
#   --error line here would make `sbatch --output=...` alone send stderr to the old path,
#   and if its directory is missing the job fails with ExitCode 0:53 before it starts.)
# --requeue + --open-mode=append: a requeued run is the same job id and writes on at the
#   end of the same log.
#
# Environment (export before sbatch; sbatch passes the environment on):
#   JUMBO_HOME        repository root (run configs and presets are relative to it);
#                     default: found from the submitted script's path, else the submit dir
#   JUMBO             the binary; default $JUMBO_HOME/build/jumbo (on the shared FS)
#   JUMBO_CONFIG      run config; default inputs/runs/j1-large.toml
#   JUMBO_RUN_NAME    names the run directory and the checkpoints; default j1-large, so a
#                     job submitted again continues the same run (resume = auto). Set a new
#                     name to start a new run.
#   JUMBO_ROOT        shared storage for runs; default /fsx/jumbo
#   JUMBO_RUN_DIR     metrics.jsonl, emf.jsonl (CloudWatch EMF);
#                     default $JUMBO_ROOT/runs/$JUMBO_RUN_NAME
#   JUMBO_CKPT_DIR    checkpoint.dir (a directory or s3://bucket/prefix);
#                     default $JUMBO_ROOT/checkpoints/$JUMBO_RUN_NAME
#   JUMBO_LAUNCHER    srun (default: srun --mpi=pmix --kill-on-bad-exit=1) or mpirun
#   JUMBO_SRUN_ARGS, JUMBO_MPIRUN_ARGS   extra launcher options (split on blanks)
#   JUMBO_MAX_FAILURES  requeues after failures (exit not 0, 2 or 75) per
#   JUMBO_FAILURE_WINDOW_HOURS  hours of the run; default 3 per 24 (JUMBO_MAX_RESTARTS, the
#                     old name, is read too). A rate, not a count over the job's life: a
#                     month-long run meets a fault now and then. Graceful stops (75) always
#                     requeue and do not count. Failures are counted in the ledger
#                     $JUMBO_CKPT_DIR/requeues.log (in $JUMBO_RUN_DIR for an s3:// checkpoint
#                     directory) across requeues and jobs submitted again for the run, not with
#                     SLURM_RESTART_COUNT, which also counts every time-limit requeue.
#   JUMBO_END_TIME    when the nodes go (ISO 8601, e.g. 2026-12-02T18:00:00Z); and
#   JUMBO_CAPACITY_BLOCK_END  a Capacity Block's EndDate (its instances go 30 min before).
#                     With the job's end time and its reservation's EndTime, the earliest is
#                     the deadline: the job stops gracefully (a checkpoint, exit 75) the last
#                     save's measured time + a step + JUMBO_DEADLINE_MARGIN_S (default 60 s)
#                     before it, and is not requeued unless the deadline is its own time limit
#                     (slurm/deadline.sh). The log's "deadline:" line says when.
#   JUMBO_EXPECT_EFA  1 (default): FI_PROVIDER=efa and
#                     NCCL_SOCKET_IFNAME=^lo,docker,veth where the environment leaves them
#                     unset; aws-ofi-nccl's directory onto LD_LIBRARY_PATH; NCCL_NET_PLUGIN=ofi
#                     only where libnccl-net.so is missing and libnccl-net-ofi.so is there;
#                     `jumbo doctor --expect-efa`;
#                     --set comm.expect_network=efa (a rank on sockets refuses). 0: no network settings (a machine without EFA)
#   JUMBO_EXPECT_GPUS GPUs per node the doctor requires; default one per rank when the run
#                     trains on CUDA (train.device, as in the p4d configs), else Slurm's count
#   JUMBO_DOCTOR      1 (default): `jumbo doctor` once per node before training (--expect-efa,
#                     --expect-gpus, --dir JUMBO_CKPT_DIR). A node that fails a check of the
#                     node (GPU, EFA, clock) is drained and the job requeues onto others
#                     (counted against JUMBO_MAX_FAILURES); software missing (NCCL, its network
#                     plugin, a CUDA build, the directory) ends the job, exit 1, not requeued.
#                     0: skip it
#   JUMBO_DRAIN_BAD_NODES  1 (default): drain such nodes (scontrol, else sudo -n with scontrol's
#                     absolute path: ParallelCluster's sudo secure_path lacks /opt/slurm/bin);
#                     ParallelCluster then replaces them. 0: only report them (exit 1)
#   JUMBO_DOCTOR_CHECK_TIMEOUT  seconds per node-local doctor check (a check still running then
#                     fails "hung after N s" and names the node); default 60
#   JUMBO_DOCTOR_LOCAL_TIMEOUT  seconds for the node-local step (a node without a report then is
#                     named "hung or unreachable"); default 2 x the check timeout + 60
#   JUMBO_DOCTOR_TIMEOUT  seconds for the collective doctor step (MPI, clocks); default 300
#   JUMBO_INSTANCE_TYPE   the EC2 instance type for the doctor's EFA device count (4 on
#                     p4d.24xlarge, 32 on p5.48xlarge); default DMI's product name on EC2
#   JUMBO_LAYOUT_FROM_PLAN  1 (default): the layout is `jumbo plan --best` for the allocated
#                     node count (printed with its memory breakdown in the log; no layout
#                     that fits ends the job, exit 2); 0: the config's layout
#   JUMBO_GPU         GPU name for jumbo plan; default the config's train.gpu, else a100-40gb
#   JUMBO_MACHINE     a machine description measured on this cluster (slurm/preflight.sh
#                     writes RUN_DIR/machine.toml): jumbo plan chooses the layout on it
#                     instead of JUMBO_GPU's data sheet; its ranks per host must be this job's
#   OMP_NUM_THREADS   threads per rank; default --cpus-per-task
#   NCCL_* / FI_*     anything set before sbatch is kept (the defaults above fill gaps)
#
# Exit codes: 0 done; 2 a mistake in the input (not requeued; the config and arguments are
# checked with `jumbo info` on the batch host first); 1 a node failed `jumbo doctor` (requeued
# after draining it when only the node was at fault, else not); 75 graceful stop (requeued); anything else from `jumbo train` is a failure,
# requeued up to JUMBO_MAX_FAILURES times per JUMBO_FAILURE_WINDOW_HOURS. The log says which,
# on lines starting "jumbo-slurm:". Requeued jobs start again after Slurm's BeginTime delay
# (AuthInfo cred_expire: 70 s on ParallelCluster, Slurm's default 120 s) with SLURM_RESTART_COUNT one higher.
#
# LAYOUT-DOC-BEGIN
# What `jumbo plan --config inputs/runs/j1-large.toml --gpu a100-40gb --nodes N --best` picks
# (formulas: docs/plan.md); jumbo prints the same breakdown at start ("plan for train.gpu").
# 4 nodes (the README's, 32 GPUs): tp 2 x pp 4 x dp 4, micro batch 1, recompute none, ZeRO-1,
# sequence parallel.
# Why it fits in 40 GB: the fullest stage (stage 1: 11 layers, 1.11B parameters per GPU)
# needs 19.3 GiB: weights 6.2, grads 5.2, optimizer 2.1 (ZeRO-1 over dp 4), activations 4.4
# (3 microbatches in flight), workspace 1.5. Estimated MFU 52.0%.
# LAYOUT-DOC-END
set -uo pipefail

home=${JUMBO_HOME:-}
if [[ -z $home ]]; then
  cmd=$(scontrol show job -o "${SLURM_JOB_ID:-0}" 2>/dev/null | sed -n 's/.* Command=\([^ ]*\).*/\1/p')
  for home in "${cmd:+$(dirname "$cmd")/..}" "$(dirname "${BASH_SOURCE[0]}")/.." "${SLURM_SUBMIT_DIR:-.}"; do
    [[ -n $home && -f $home/slurm/common.sh ]] && break
  done
fi
# shellcheck source=slurm/common.sh
source "$home/slurm/common.sh" 2>/dev/null || {
  echo "jumbo-slurm: not requeued because slurm/common.sh is not under '$home': set JUMBO_HOME" \
    "to the repository, or submit from its root"
  exit 2
}
JUMBO_HOME=$(cd "$home" && pwd)
jumbo_train_main j1-large inputs/runs/j1-large.toml "$@"
