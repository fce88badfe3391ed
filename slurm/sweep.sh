#!/usr/bin/env bash
#SBATCH --job-name=jumbo-sweep
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@300
#SBATCH --time=04:00:00
#
# A parameter sweep as one Slurm job array: one task per point of a grid of --set
# overrides, each a full `jumbo train` with its own checkpoints and metrics, then a summary
# job (--dependency=afterany on the array) that prints one row per task, best first.
#
#   slurm/sweep.sh submit GRID_FILE [SBATCH_OPTIONS...] [-- TRAIN_ARGS...]
#       writes the sweep directory, submits the array and the summary job, prints
#       "sweep_dir=DIR array_job=ID summary_job=ID" as its last line.
#       SBATCH_OPTIONS go to the array's sbatch (they override the #SBATCH lines above,
#       which are the defaults of one task: one p4d node, 8 ranks); --partition, --account,
#       --qos and --reservation also go to the summary job.
#       TRAIN_ARGS go to every task's `jumbo train`, before the task's own overrides.
#   slurm/sweep.sh summary SWEEP_DIR      the table again (also what the summary job runs)
#   slurm/sweep.sh task SWEEP_DIR         one array task (sbatch runs this; not by hand)
#
# GRID_FILE: one line per group of tasks; blank lines and # comments are skipped. A line
# is space-separated section.key=value words; a value with commas lists alternatives and
# the line expands to the cartesian product (the first word varies slowest):
#     train.lr=1e-4,3e-4 parallel.micro_batch=1,2     -> 4 tasks
#     train.lr=6e-4 train.warmup_tokens=0             -> 1 task
# Commas inside [...] or "..." do not split (parallel.stage_layers=[10,10,9] is one value).
# Values cannot contain blanks. Tasks are numbered from 0 in file order.
#
# Environment: as slurm/train_jumbo.sh (JUMBO, JUMBO_CONFIG, JUMBO_LAUNCHER,
# JUMBO_EXPECT_EFA, JUMBO_DOCTOR, JUMBO_LAYOUT_FROM_PLAN, JUMBO_MAX_FAILURES, ...), plus
#   JUMBO_CONFIG          run config of every task; default inputs/runs/j1-large.toml
#   JUMBO_SWEEP_DIR       where everything goes (on the shared file system); default
#                         $JUMBO_ROOT/sweeps/GRIDNAME-YYYYmmdd-HHMMSS (JUMBO_ROOT: /fsx/jumbo)
#   JUMBO_SWEEP_PARALLEL  at most this many tasks at once (--array=0-N%K); default no limit
#   JUMBO_SWEEP_SUMMARY_PARTITION  the partition of the summary job (one CPU for seconds);
#                         default "cpu" where the cluster has it (parallelcluster/cluster.yaml
#                         does: an exclusive p4d queue would give it a whole GPU node), else
#                         the array's --partition
#
# The sweep directory:
#   tasks                 line i = the overrides of task i;  args: the TRAIN_ARGS
#   logs/ARRAYID_i.out    task i's job log;  logs/summary-ID.out: the summary job's
#   task-i/               metrics.jsonl, emf.jsonl, ckpt/ (checkpoint.dir, with requeues.log)
#   results/task-i.json   {"task", "job", "overrides", "exit_code", "steps", "loss",
#                          "val_loss", "tokens_per_s"}: written when the task ends for good
#                          (not when it is requeued); loss and val_loss are the last ones
#                          in the metrics, tokens_per_s the median over steps after the first
#   summary.txt           the table: sorted by val_loss when any task has one, else by loss;
#                         tasks that failed or left no result at the end
# A task requeues itself like the training jobs do (exit 75 after SIGUSR1, or a failure
# within JUMBO_MAX_FAILURES per JUMBO_FAILURE_WINDOW_HOURS); the summary job waits for that, since afterany waits for the
# array's tasks to end, and a requeued task has not ended.
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
  echo "jumbo-slurm: slurm/common.sh is not under '$home': set JUMBO_HOME to the repository"
  exit 2
}
JUMBO_HOME=$(cd "$home" && pwd)
SWEEP_DEFAULT_CONFIG=inputs/runs/j1-large.toml

sweep_usage() {
  sed -n '/^#   slurm\/sweep.sh submit/,/^#   slurm\/sweep.sh task/p' "$JUMBO_HOME/slurm/sweep.sh" >&2
  exit 2
}

# sweep_expand GRID_FILE: one line per task, its overrides separated by blanks.
sweep_expand() {
  python3 - "$1" <<'EOF'
import itertools, sys

def split_values(value):
    out, cur, depth, quoted = [], "", 0, False
    for c in value:
        if c == '"':
            quoted = not quoted
        elif not quoted and c == "[":
            depth += 1
        elif not quoted and c == "]":
            depth -= 1
        if c == "," and depth == 0 and not quoted:
            out.append(cur)
            cur = ""
        else:
            cur += c
    return out + [cur]

for n, line in enumerate(open(sys.argv[1]), 1):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    axes = []
    for word in line.split():
        key, eq, value = word.partition("=")
        if not eq or "." not in key:
            sys.exit(f"{sys.argv[1]}:{n}: '{word}': expected section.key=value")
        values = split_values(value)
        if any(v == "" for v in values) and len(values) > 1:
            sys.exit(f"{sys.argv[1]}:{n}: '{word}': an empty alternative")
        axes.append([f"{key}={v}" for v in values])
    for point in itertools.product(*axes):
        print(" ".join(point))
EOF
}

# Options of the array's sbatch that the summary job should share.
sweep_summary_opts() {
  local a take=
  for a in "$@"; do
    if [[ -n $take ]]; then
      printf '%s\n' "$a"
      take=
      continue
    fi
    case $a in
      --partition=* | --account=* | --qos=* | --reservation=* | -p?* | -A?*) printf '%s\n' "$a" ;;
      --partition | --account | --qos | --reservation | -p | -A) printf '%s\n' "$a"; take=1 ;;
    esac
  done
}

sweep_submit() {
  local grid=${1:-} n dir script array_id summary_id sb_opts=() train_args=() throttle=
  [[ -n $grid ]] || sweep_usage
  shift
  while (($#)); do
    if [[ $1 == -- ]]; then
      shift
      train_args=("$@")
      break
    fi
    sb_opts+=("$1")
    shift
  done
  [[ -f $grid ]] || { echo "sweep: no grid file $grid" >&2; exit 2; }
  grid=$(cd "$(dirname "$grid")" && pwd)/$(basename "$grid")
  script=$JUMBO_HOME/slurm/sweep.sh
  # Not jumbo_defaults: what is exported here reaches every task (OMP_NUM_THREADS must be
  # chosen there, from the task's own --cpus-per-task).
  : "${JUMBO:=$JUMBO_HOME/build/jumbo}" "${JUMBO_CONFIG:=$SWEEP_DEFAULT_CONFIG}" "${JUMBO_ROOT:=/fsx/jumbo}"
  cd "$JUMBO_HOME" || exit 2
  [[ -f $JUMBO_CONFIG ]] || { echo "sweep: JUMBO_CONFIG=$JUMBO_CONFIG does not exist (relative to $PWD)" >&2; exit 2; }
  [[ -x $JUMBO ]] || { echo "sweep: JUMBO=$JUMBO is not an executable" >&2; exit 2; }
  dir=${JUMBO_SWEEP_DIR:-$JUMBO_ROOT/sweeps/$(basename "${grid%.*}")-$(date +%Y%m%d-%H%M%S)}
  mkdir -p "$dir/logs" "$dir/results" && dir=$(cd "$dir" && pwd) || exit 1
  [[ ! -s $dir/tasks ]] || { echo "sweep: $dir already holds a sweep" >&2; exit 2; }
  sweep_expand "$grid" >"$dir/tasks.new" || { rm -f "$dir/tasks.new"; exit 2; }
  mv "$dir/tasks.new" "$dir/tasks"
  cp "$grid" "$dir/grid"
  : >"$dir/args"
  ((${#train_args[@]} == 0)) || printf '%s\n' "${train_args[@]}" >"$dir/args"
  n=$(wc -l <"$dir/tasks")
  ((n > 0)) || { echo "sweep: $grid has no tasks" >&2; exit 2; }
  echo "sweep: $n tasks in $dir (config $JUMBO_CONFIG)"
  awk '{ printf "  task %d: %s\n", NR - 1, $0 }' "$dir/tasks"

  # Absolute paths for the tasks, which run from the repository and get this environment.
  export JUMBO_HOME
  JUMBO=$(cd "$(dirname "$JUMBO")" && pwd)/$(basename "$JUMBO")
  export JUMBO JUMBO_CONFIG JUMBO_ROOT
  [[ -n ${JUMBO_SWEEP_PARALLEL:-} ]] && throttle=%$JUMBO_SWEEP_PARALLEL
  array_id=$(sbatch --parsable --array="0-$((n - 1))$throttle" --job-name=jumbo-sweep \
    --output="$dir/logs/%A_%a.out" "${sb_opts[@]}" "$script" task "$dir") ||
    { echo "sweep: sbatch of the array failed" >&2; exit 1; }
  array_id=${array_id%%;*}
  local summary_opts summary_partition=${JUMBO_SWEEP_SUMMARY_PARTITION:-}
  mapfile -t summary_opts < <(sweep_summary_opts "${sb_opts[@]}")
  if [[ -z $summary_partition ]] && scontrol show partition cpu >/dev/null 2>&1; then
    summary_partition=cpu
  fi
  if [[ -n $summary_partition ]]; then
    # The array's partition is a GPU queue's; the rest (account, qos...) still applies.
    local o keep=() skip=
    for o in "${summary_opts[@]}"; do
      if [[ -n $skip ]]; then skip=; continue; fi
      case $o in
        --partition | -p) skip=1 ;;
        --partition=* | -p?*) ;;
        *) keep+=("$o") ;;
      esac
    done
    summary_opts=("${keep[@]}" --partition="$summary_partition")
    echo "sweep: the summary job goes to partition $summary_partition"
  fi
  summary_id=$(sbatch --parsable --dependency="afterany:$array_id" --kill-on-invalid-dep=no \
    --job-name=jumbo-sweep-summary --nodes=1 --ntasks=1 --output="$dir/logs/summary-%j.out" \
    "${summary_opts[@]}" --wrap="bash '$script' summary '$dir'") ||
    { echo "sweep: sbatch of the summary job failed (the array $array_id runs)" >&2; exit 1; }
  summary_id=${summary_id%%;*}
  echo "sweep: array job $array_id (tasks 0-$((n - 1))), summary job $summary_id" \
    "(afterany:$array_id) writes $dir/summary.txt"
  echo "sweep_dir=$dir array_job=$array_id summary_job=$summary_id"
}

# sweep_result DIR TASK OVERRIDES: results/task-TASK.json from the task's metrics.
sweep_result() {
  local dir=$1 task=$2 overrides=$3
  python3 - "$dir/task-$task/metrics.jsonl" "$dir/results/task-$task.json" "$task" \
    "${SLURM_ARRAY_JOB_ID:-}_${SLURM_ARRAY_TASK_ID:-}" "$overrides" "$JUMBO_RC" <<'EOF'
import json, os, statistics, sys
metrics, out, task, job, overrides, rc = sys.argv[1:]
rows = []
if os.path.exists(metrics):
    for line in open(metrics):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # a line cut short by a crash
val = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
rates = [r["tokens_per_s"] for r in (rows[1:] or rows) if r.get("tokens_per_s") is not None]
result = {
    "task": int(task), "job": job, "overrides": overrides, "exit_code": int(rc),
    "steps": rows[-1]["step"] if rows else 0,
    "loss": rows[-1].get("loss") if rows else None,
    "val_loss": val[-1] if val else None,
    "tokens_per_s": statistics.median(rates) if rates else None,
}
with open(out + ".tmp", "w") as f:
    json.dump(result, f)
    f.write("\n")
os.replace(out + ".tmp", out)
EOF
}

sweep_task() {
  local dir=${1:-} task=${SLURM_ARRAY_TASK_ID:-} overrides words=() args=() w
  [[ -n $dir && -f $dir/tasks ]] || jumbo_fail_input "sweep task: no sweep directory '$dir'"
  [[ -n $task ]] || jumbo_fail_input "sweep task: not an array task (SLURM_ARRAY_TASK_ID unset)"
  overrides=$(sed -n "$((task + 1))p" "$dir/tasks")
  read -ra words <<<"$overrides"
  [[ -f $dir/args ]] && mapfile -t args <"$dir/args"
  for w in "${words[@]}"; do args+=(--set "$w"); done
  JUMBO_RUN_NAME=$(basename "$dir")-$task
  JUMBO_RUN_DIR=$dir/task-$task
  JUMBO_CKPT_DIR=$dir/task-$task/ckpt
  jumbo_log "sweep task $task of $dir: $overrides"
  # The result is written whenever the task ends for good, early exits (a bad override:
  # exit 2) included; a requeued task writes it when its last run ends.
  jumbo_final_hook() {
    [[ $JUMBO_DECISION == requeued ]] && return
    sweep_result "$dir" "$task" "$overrides" &&
      jumbo_log "result: $dir/results/task-$task.json: $(cat "$dir/results/task-$task.json")"
  }
  jumbo_run_training "$JUMBO_RUN_NAME" "$SWEEP_DEFAULT_CONFIG" "${args[@]}"
  jumbo_exit "$JUMBO_EXIT"
}

# sweep_summary DIR: the table, to DIR/summary.txt and stdout.
sweep_summary() {
  local dir=${1:-}
  [[ -n $dir && -f $dir/tasks ]] || { echo "sweep: no sweep directory '$dir'" >&2; exit 2; }
  python3 - "$dir" <<'EOF' | tee "$dir/summary.txt.tmp"
import glob, json, os, sys
d = sys.argv[1]
tasks = [l.rstrip("\n") for l in open(os.path.join(d, "tasks"))]
results = {}
for p in glob.glob(os.path.join(d, "results", "task-*.json")):
    r = json.load(open(p))
    results[r["task"]] = r
rows = [results.get(i, {"task": i, "overrides": o, "exit_code": None, "steps": None,
                        "loss": None, "val_loss": None, "tokens_per_s": None})
        for i, o in enumerate(tasks)]
key = "val_loss" if any(r["val_loss"] is not None for r in rows) else "loss"
def order(r):
    ok = r["exit_code"] == 0 and r[key] is not None
    return (not ok, r[key] if r[key] is not None else float("inf"), r["task"])
rows.sort(key=order)
def f(v, fmt):
    return "-" if v is None else format(v, fmt)
print(f"sweep {d}: {len(results)} of {len(tasks)} tasks reported; sorted by {key}")
print(f"{'rank':>4} {'task':>4} {'exit':>4} {'steps':>6} {'loss':>9} {'val_loss':>9} {'tokens/s':>10}  overrides")
for n, r in enumerate(rows, 1):
    print(f"{n:>4} {r['task']:>4} {f(r['exit_code'], 'd'):>4} {f(r['steps'], 'd'):>6} "
          f"{f(r['loss'], '.4f'):>9} {f(r['val_loss'], '.4f'):>9} {f(r['tokens_per_s'], '.0f'):>10}  "
          f"{r['overrides']}")
EOF
  local rc=${PIPESTATUS[0]}
  mv "$dir/summary.txt.tmp" "$dir/summary.txt"
  return "$rc"
}

case ${1:-} in
  submit) shift; sweep_submit "$@" ;;
  task) shift; sweep_task "$@" ;;
  summary) shift; sweep_summary "$@" ;;
  *) sweep_usage ;;
esac
