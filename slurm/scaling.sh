#!/usr/bin/env bash
#SBATCH --job-name=jumbo-scaling
#SBATCH --nodes=1
#SBATCH --ntasks=8
#SBATCH --time=01:00:00
#SBATCH --output=logs/%x-%j.out
#
# Scaling runs over `mpirun -np`: one result line per run.
#   slurm/scaling.sh strong  [MODEL]  fixed global batch, more ranks (efficiency = speed-up / ranks)
#   slurm/scaling.sh weak    [MODEL]  global batch grows with the ranks (efficiency = per-rank rate kept)
#   slurm/scaling.sh memory  [MODEL]  one job size, tp x pp from 1 to 8: memory per rank falls
# MODEL defaults to inputs/models/tiny.toml (with 8 layers and 8 heads, so tp and pp up to 8).
#
# Where it runs:
#   - on a workstation: `slurm/scaling.sh strong`; ranks 1, 2, 4, ... up to
#     JUMBO_SCALING_MAX_NP (default 8), oversubscribing the cores if need be;
#   - in a Slurm allocation (`salloc -N2 --ntasks-per-node=8 slurm/scaling.sh weak`, or
#     `mkdir -p logs && sbatch [--nodes=...] slurm/scaling.sh strong`): mpirun places the
#     ranks on the allocation's hosts (Open MPI reads the allocation and starts its daemons
#     with srun), and the rank counts go up to SLURM_NTASKS. memory mode always uses 8 ranks.
# Environment: JUMBO (default build/jumbo), JUMBO_HOME (the repository; found from the
# script's path, or Slurm's record of it under sbatch), JUMBO_SCALING_DIR (tokenizer, data,
# metrics; default build/scaling; on a shared file system when the ranks span nodes),
# JUMBO_SCALING_BATCH (strong scaling's global batch; default 32, or the largest rank
# count if that is more). Numbers on a 2-core machine measure the code paths, not a cluster.
set -euo pipefail

home=${JUMBO_HOME:-}
if [[ -z $home ]]; then
  cmd=$(scontrol show job -o "${SLURM_JOB_ID:-0}" 2>/dev/null | sed -n 's/.* Command=\([^ ]*\).*/\1/p') || true
  for home in "${cmd:+$(dirname "$cmd")/..}" "$(dirname "${BASH_SOURCE[0]}")/.." "${SLURM_SUBMIT_DIR:-.}"; do
    [[ -n $home && -f $home/slurm/scaling.sh ]] && break
  done
fi
cd "$home"
mode=${1:-strong}
model=${2:-inputs/models/tiny.toml}
jumbo=${JUMBO:-build/jumbo}
work=${JUMBO_SCALING_DIR:-build/scaling}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_rmaps_base_oversubscribe=1  # harmless where the slots suffice
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# The largest rank count: the allocation's tasks, else JUMBO_SCALING_MAX_NP.
if [[ -n ${SLURM_JOB_ID:-} && -n ${SLURM_NTASKS:-} ]]; then
  max_np=$SLURM_NTASKS
  where="Slurm job $SLURM_JOB_ID (${SLURM_JOB_NODELIST:-?}, $SLURM_NTASKS tasks)"
else
  max_np=${JUMBO_SCALING_MAX_NP:-8}
  where="$(hostname) (no Slurm allocation)"
fi
rank_counts=()
for ((np = 1; np <= max_np; np *= 2)); do rank_counts+=("$np"); done
strong_batch=${JUMBO_SCALING_BATCH:-$((rank_counts[-1] > 32 ? rank_counts[-1] : 32))}

prepare_data() {
  mkdir -p "$work"
  if [[ ! -f $work/tok.model ]]; then
    "$jumbo" data tokenizer --input inputs/data/brown-valid.jsonl --output "$work/tok" \
      --vocab-size 500 --input-sentence-size 2000 --threads 1 >/dev/null
  fi
  [[ -f $work/data.parts ]] || "$jumbo" data prepare --input inputs/data/brown-train.jsonl \
    --tokenizer "$work/tok.model" --output "$work/data" >/dev/null
}

# run NP TP PP GLOBAL_BATCH -> "tokens_per_s|mem_line"
run() {
  local np=$1 tp=$2 pp=$3 batch=$4 metrics="$work/metrics-$1-$2-$3-$4.jsonl"
  rm -f "$metrics"
  mpirun -np "$np" "$jumbo" train --set "model.preset=$model" --set model.vocab=1024 --set model.layers=8 --set model.heads=8 \
    --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.micro_batch=1 \
    --set train.steps=6 --set train.global_batch="$batch" --set train.eval_every=0 \
    --set "data.train=$work/data" --set data.valid= --set "data.tokenizer=$work/tok.model" \
    --set "log.metrics_file=$metrics" --set log.every=100 --set log.peak_tflops=1 >"$work/log" 2>&1 ||
    { cat "$work/log" >&2; exit 1; }
  # Median tokens/s of steps 2..6 (step 1 warms caches and scratch).
  local rate mem
  rate=$(python3 -c '
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
print(round(statistics.median(r["tokens_per_s"] for r in rows)))' "$metrics")
  mem=$(grep -o "memory per rank: .*;" "$work/log" | head -1 | sed 's/;$//')
  echo "$rate|$mem"
}

scale() {
  local base='' np batch out rate eff
  for np in "${rank_counts[@]}"; do
    batch=$([[ $mode == strong ]] && echo "$strong_batch" || echo $((8 * np)))
    out=$(run "$np" 1 1 "$batch")
    rate=${out%%|*}
    base=${base:-$rate}
    # strong: speed-up / ranks; weak: rate per rank kept. Both are rate / (base x np).
    eff=$(python3 -c "print(f'{$rate / ($base * $np):.2f}')")
    echo "$mode np=$np layout=(1,1,$np) global_batch=$batch tokens/s=$rate efficiency=$eff"
  done
}

memory() {
  local layout tp pp out
  for layout in "1 1" "2 1" "1 2" "2 2" "4 2" "2 4" "8 1" "1 8"; do
    read -r tp pp <<<"$layout"
    out=$(run 8 "$tp" "$pp" 32)
    echo "memory np=8 layout=($tp,$pp,$((8 / (tp * pp)))) tokens/s=${out%%|*} rank 0 ${out#*|}"
  done
}

case $mode in
  strong | weak | memory) ;;
  *) echo "usage: slurm/scaling.sh strong|weak|memory [MODEL]" >&2; exit 2 ;;
esac
[[ $mode == memory ]] && ranks=8 || ranks=${rank_counts[*]}
echo "scaling: $mode on $where; ranks $ranks; model $model"
prepare_data
case $mode in
  strong | weak) scale ;;
  memory) memory ;;
esac
