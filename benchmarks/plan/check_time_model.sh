#!/usr/bin/env bash
# The planner's time model against measured steps on this machine (issue 25; docs/plan.md
# "Checking the time model"). In each round it writes a machine description with `jumbo
# bench comm --write-machine` on NP ranks (default 2), then runs `jumbo bench train --config
# --machine` with it for each layout of a small model; it prints predicted against measured
# step times (medians over the rounds), the median of each round's ratio, the terms, and the
# two rankings. A description per round: a shared machine's speed drifts by several percent
# over minutes, and a prediction is of the machine as it was measured. A benchmark, not a
# test: run it on a quiet machine.
#   benchmarks/plan/check_time_model.sh [JUMBO] [OUT_DIR]
# CHECK_HOSTS (e.g. host1:1,host2:1, inside benchmarks/plan/shaped_hosts.sh's hosts) places
# the ranks with mpirun --host; CHECK_RANKS (default 2) ranks write the machine description.
# Exits 1 when a layout is off by more than 15% or the recommended (predicted fastest)
# layout is not measured fastest or within 5% of it.
set -euo pipefail
jumbo=$(realpath "${1:-build/jumbo}")
out=${2:-$(mktemp -d)}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
np=${CHECK_RANKS:-2}
steps=${CHECK_STEPS:-8}
repeats=${CHECK_REPEATS:-3}  # runs per layout, in rounds; the median is compared
hosts=()
[[ -n ${CHECK_HOSTS:-} ]] && hosts=(--host "$CHECK_HOSTS")
model=(--set model.preset=inputs/models/tiny.toml --set model.d_model=256 --set model.layers=8
  --set model.heads=8 --set model.context=128 --set model.vocab=2048 --set train.global_batch=16)
# name|ranks|overrides
layouts=(
  "1 rank|1|--set parallel.micro_batch=2"
  "dp 2|2|--set parallel.micro_batch=2"
  "dp 2 ZeRO-1|2|--set parallel.micro_batch=2 --set parallel.zero1=true"
  "tp 2|2|--set parallel.micro_batch=2 --set parallel.tp=2"
  "tp 2 sequence parallel|2|--set parallel.micro_batch=2 --set parallel.tp=2 --set parallel.sequence_parallel=true"
  "pp 2|2|--set parallel.micro_batch=2 --set parallel.pp=2"
  "pp 2 interleaved v2|2|--set parallel.micro_batch=2 --set parallel.pp=2 --set parallel.virtual_stages=2"
  "pp 2 full recompute|2|--set parallel.micro_batch=2 --set parallel.pp=2 --set parallel.recompute=full"
  "dp 2 selective recompute|2|--set parallel.micro_batch=2 --set parallel.recompute=selective"
  "dp 2 micro batch 1|2|--set parallel.micro_batch=1"
)
: >"$out/runs"
# Each round runs every layout once: a slow spell of the machine lands on all of them alike.
for ((round = 1; round <= repeats; round++)); do
  machine=$out/machine.$round.toml
  mpirun "${hosts[@]}" -np "$np" "$jumbo" bench comm --max-bytes $((64 << 20)) \
    --seconds-per-size 0.3 --write-machine "$machine" >"$out/bench_comm.$round.txt" </dev/null
  echo "  round $round: $(tail -1 "$out/bench_comm.$round.txt")"
  for entry in "${layouts[@]}"; do
    IFS='|' read -r name ranks overrides <<<"$entry"
    # shellcheck disable=SC2086  # overrides is a list of --set words
    mpirun "${hosts[@]}" -np "$ranks" "$jumbo" bench train --config inputs/runs/demo.toml "${model[@]}" \
      $overrides --machine "$machine" --steps "$steps" >"$out/run.txt" 2>&1 </dev/null ||
      { echo "check_time_model: $name failed:"; tail -5 "$out/run.txt"; exit 1; }
    line=$(grep '^preflight: step' "$out/run.txt")
    terms=$(grep 'plan for' "$out/run.txt" | sed 's/.*= //')
    measured=$(sed -E 's/.*measured=([0-9.]+)s.*/\1/' <<<"$line")
    plan=$(sed -E 's/.*plan=([0-9.]+)s.*/\1/' <<<"$line")
    echo "$name|$ranks|$plan|$measured|$terms" >>"$out/runs"
    echo "  round $round, $name: plan $plan s, measured $measured s"
  done
done
# Per layout: the medians of the rounds' plans and measurements, and of their ratios; the
# terms of the last round.
python3 - "$out/runs" >"$out/results" <<'PYEOF'
import statistics, sys
runs = {}
for l in open(sys.argv[1]):
    name, ranks, plan, measured, terms = l.rstrip("\n").split("|")
    r = runs.setdefault(name, {"ranks": ranks, "plan": [], "measured": []})
    r["plan"].append(float(plan))
    r["measured"].append(float(measured))
    r["terms"] = terms
for name, r in runs.items():
    ratio = statistics.median(m / p for m, p in zip(r["measured"], r["plan"]))
    print(f"{name}|{r['ranks']}|{statistics.median(r['plan']):.4f}|"
          f"{statistics.median(r['measured']):.4f}|{ratio:.4f}|{r['terms']}")
PYEOF
python3 - "$out/results" <<'PYEOF'
import sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1])]
ok = True
print(f"{'layout':<28} {'ranks':>5} {'plan s':>8} {'measured s':>10} {'ratio':>6}  (medians of the rounds)")
for name, ranks, plan, measured, ratio, terms in rows:
    r = float(ratio)
    flag = "" if abs(r - 1) <= 0.15 else "  <- over 15%"
    ok &= not flag
    print(f"{name:<28} {ranks:>5} {float(plan):>8.4f} {float(measured):>10.4f} {r:>6.3f}{flag}")
by_plan = sorted(rows, key=lambda x: float(x[2]))
by_meas = sorted(rows, key=lambda x: float(x[3]))
print("ranking by plan:    ", " < ".join(x[0] for x in by_plan))
print("ranking by measured:", " < ".join(x[0] for x in by_meas))
best, fastest = by_plan[0], by_meas[0]
gap = float(best[3]) / float(fastest[3]) - 1
print(f"recommended (predicted fastest): {best[0]}, measured {100 * gap:.1f}% slower than the "
      f"fastest ({fastest[0]})")
ok &= gap <= 0.05
print("terms of each layout (the last round's):")
for name, _, _, _, _, terms in rows:
    print(f"  {name}: {terms}")
sys.exit(0 if ok else 1)
PYEOF
