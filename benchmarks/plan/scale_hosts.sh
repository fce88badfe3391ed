#!/usr/bin/env bash
# Scale on the multi-host harness (issue 25): the tiny model on 8 hosts of this one machine
# (oversubscribed) at 8, 32 and 64 ranks with the same per-rank shapes (tp 2 x pp 2 x dp
# W/4, micro batch 1, 2 microbatches per pipeline): every run completes and its losses
# equal a one-rank run of the same global batch; the measured peak memory per rank stays
# flat (within 2% of the 8-rank run's); the start-up time (launch to the first step's line,
# less one step) against world size. Needs root. Exits 1 on a failed check.
#   benchmarks/plan/scale_hosts.sh [JUMBO] [OUT_DIR]   (SCALE_WORLDS="8 32 64" to change)
set -uo pipefail
jumbo=$(realpath "${1:-build/jumbo}")
out=${2:-$(mktemp -d)}
cd "$(dirname "$0")/../.."
# shellcheck source=tests/support/slurm_multihost.sh
source tests/support/slurm_multihost.sh
# shellcheck source=tests/support/small_run.sh
source tests/support/small_run.sh
multihost_possible || exit 1
mkdir -p "$out"
trap stop_multihost EXIT
start_multihost "$out/cluster" scale 8 8 || { multihost_logs; exit 1; }
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 \
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_small_data "$jumbo" "$out" || { echo "scale: no data"; exit 1; }
common=(--set model.preset=inputs/models/tiny.toml --set parallel.micro_batch=1
  --set train.eval_every=0 --set "data.train=$out/data" --set data.valid=
  --set "data.tokenizer=$out/tok.model" --set log.peak_tflops=1 --set train.steps=3)
# timed_run LOG CMD...: runs CMD, its output to LOG with each line's seconds since launch.
timed_run() {
  local log=$1
  shift
  python3 - "$log" "$@" <<'PYEOF'
import subprocess, sys, time
log, cmd = sys.argv[1], sys.argv[2:]
t0 = time.monotonic()
with open(log, "w") as f:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL)
    for line in p.stdout:
        f.write(f"{time.monotonic() - t0:.3f} {line}")
    sys.exit(p.wait())
PYEOF
}
status=0
worlds=(${SCALE_WORLDS:-8 32 64})
printf '%6s %6s %12s %10s %12s %10s\n' ranks dp "peak MiB" "vs first" "start-up s" "step s" | tee "$out/table"
first_peak=
for w in "${worlds[@]}"; do
  dp=$((w / 4))
  batch=$((2 * dp))
  per_host=$((w / 8))
  hosts=$(printf 'host%d:%d,' $(for h in 1 2 3 4 5 6 7 8; do echo "$h $per_host"; done) | sed 's/,$//')
  timed_run "$out/run$w.log" mpirun --host "$hosts" -np "$w" "$jumbo" train "${common[@]}" \
    --set parallel.tp=2 --set parallel.pp=2 --set train.global_batch=$batch \
    --set "log.metrics_file=$out/m$w.jsonl" || { echo "scale: $w ranks failed"; tail -5 "$out/run$w.log"; status=1; continue; }
  OMP_NUM_THREADS=1 "$jumbo" train "${common[@]}" --set train.global_batch=$batch \
    --set "log.metrics_file=$out/one$w.jsonl" >"$out/one$w.log" 2>&1 </dev/null ||
    { echo "scale: the one-rank run of batch $batch failed"; status=1; continue; }
  python3 - "$out/m$w.jsonl" "$out/one$w.jsonl" <<'PYEOF' || { echo "scale: $w ranks differ from one rank"; status=1; }
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 3, (a, b)
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
assert worst < 1e-5, (a, b)
print(f"  losses equal one rank's within {worst:.1e} relative: {a}")
PYEOF
  peak=$(sed -nE 's/.*measured peak ([0-9.]+) MiB.*/\1/p' "$out/run$w.log")
  # Start-up: launch to the first step's line, less that step's own time (the metrics').
  first_line=$(awk '/ step +1\//{print $1; exit}' "$out/run$w.log")
  read -r step1 step3 < <(python3 -c "import json; m = [json.loads(l) for l in open('$out/m$w.jsonl')]; print(m[0]['step_time_s'], m[-1]['step_time_s'])")
  step=$(python3 -c "print(f'{$step3:.4f}')")
  startup=$(python3 -c "print(f'{$first_line - $step1:.2f}')")
  first_peak=${first_peak:-$peak}
  vs=$(python3 -c "print(f'{100 * ($peak / $first_peak - 1):+.2f}%')")
  printf '%6s %6s %12s %10s %12s %10s\n' "$w" "$dp" "$peak" "$vs" "$startup" "$step" | tee -a "$out/table"
  python3 -c "import sys; sys.exit(0 if abs($peak / $first_peak - 1) <= 0.02 else 1)" ||
    { echo "scale: peak memory per rank at $w ranks is $vs of the $((worlds[0]))-rank run's"; status=1; }
done
exit "$status"
