#!/usr/bin/env bash
# Renders the ParallelCluster config: every ${NAME} in the template is replaced by the value of
# the environment variable NAME (like envsubst, restricted to the names the template uses), and
# the FSx file system is sized from `jumbo plan --storage` of the run it is for.
# The placeholders are listed at the top of cluster.yaml and in parallelcluster/README.md.
#
#   parallelcluster/render.sh [--capacity ondemand|odcr|block] [--instance p4d.24xlarge|p5.48xlarge]
#       --run CONFIG --nodes N [--tokens T] [--data-bytes BYTES] [--max-capacity GIB]
#       [--jumbo PATH] OUTPUT [TEMPLATE]
#   TEMPLATE: cluster.yaml beside this script. --capacity (default ondemand) keeps the template's
#   "# <capacity NAMES>" ... "# </capacity>" blocks that name it and drops the others: odcr = an
#   On-Demand Capacity Reservation, block = a Capacity Block for ML. --instance (default
#   p4d.24xlarge) does the same with "# <instance NAMES>" blocks. Only the placeholders left
#   after that must be set. --run, --nodes, --tokens: the run config, node count and token
#   budget given to `jumbo plan` (--jumbo, default $JUMBO or build/jumbo of this repository).
#   --data-bytes: the corpus's size, given to the plan, for when it cannot see the files (their
#   home is S3; without it the plan prints data_bytes=0 and render.sh refuses).
#   --max-capacity: the largest file system you may create (default 100800 GiB).
#
# A missing or empty variable is reported on one line of its own, naming it; then the script
# exits 2 and writes nothing. Values are written into YAML as they are, so a value holding a
# double quote, a backslash or a line break is refused as well. A run the file system cannot
# hold, or a plan that fails, is refused in one line, and nothing is written.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage="usage: render.sh [--capacity ondemand|odcr|block] [--instance p4d.24xlarge|p5.48xlarge] --run CONFIG --nodes N [--tokens T] [--data-bytes BYTES] [--max-capacity GIB] [--jumbo PATH] OUTPUT [TEMPLATE]"
die() {
  echo "render.sh: $*" >&2
  exit 2
}
capacity=ondemand instance=p4d.24xlarge run="" nodes="" tokens="" data_bytes_given=""
# 100800 GiB: the largest FSx for Lustre size AWS's own HyperPod API accepts (SageMaker API
# FSxLustreConfig.SizeInGiB); a stand-in for your account's FSx quota, which may be lower.
max_capacity=100800
jumbo=${JUMBO:-$here/../build/jumbo}
while (($# > 0)); do
  case $1 in
    --capacity | --instance | --run | --nodes | --tokens | --data-bytes | --max-capacity | --jumbo)
      (($# >= 2)) || die "$1: expected a value after it"
      case $1 in
        --capacity) capacity=$2 ;;
        --instance) instance=$2 ;;
        --run) run=$2 ;;
        --nodes) nodes=$2 ;;
        --tokens) tokens=$2 ;;
        --data-bytes) data_bytes_given=$2 ;;
        --max-capacity) max_capacity=$2 ;;
        --jumbo) jumbo=$2 ;;
      esac
      shift 2 ;;
    -h | --help) echo "$usage" >&2; exit 2 ;;
    --*) die "$1: unknown option ($usage)" ;;
    *) break ;;
  esac
done
case $capacity in
  ondemand | odcr | block) ;;
  *) die "--capacity '$capacity': expected ondemand, odcr or block" ;;
esac
# The GPU of each instance type, as jumbo names it (src/config/gpus.cpp, whose table gives the
# same instance type for each).
case $instance in
  p4d.24xlarge) gpu=a100-40gb ;;
  p5.48xlarge) gpu=h100-80gb ;;
  *) die "--instance '$instance': expected p4d.24xlarge or p5.48xlarge" ;;
esac
if (($# < 1 || $# > 2)); then
  echo "$usage" >&2
  exit 2
fi
output=$1
template=${2:-$here/cluster.yaml}
[[ -r $template ]] || die "template $template: not readable"
[[ -n $run ]] || die "--run CONFIG is needed: the file system is sized from \`jumbo plan --storage\` of the run"
[[ -r $run ]] || die "--run $run: not a readable run config"
[[ $nodes =~ ^[1-9][0-9]*$ ]] || die "--nodes '$nodes': expected the run's node count, a whole number >= 1"
[[ -z $data_bytes_given || $data_bytes_given =~ ^[0-9]+$ ]] || die "--data-bytes '$data_bytes_given': expected bytes, a whole number"
[[ $max_capacity =~ ^[1-9][0-9]*$ ]] || die "--max-capacity '$max_capacity': expected GiB, a whole number"
[[ -x $jumbo ]] || die "jumbo binary $jumbo: not executable (build it, or pass --jumbo PATH / JUMBO=PATH)"

# --- The variant's lines: outside any block, or inside a block that names it. A block that is
# not closed, or nested, is a broken template: refused with its line number.
text="" code="" block="" kind="" number=0
open_re='^[[:space:]]*# <(capacity|instance) ([a-z0-9. ]+)>[[:space:]]*$'
close_re='^[[:space:]]*# </(capacity|instance)>[[:space:]]*$'
sizing_re='^([[:space:]]*)# <fsx sizing>[[:space:]]*$'
sizing_mark=$'\x01fsx sizing' sizing_indent=""
while IFS= read -r line || [[ -n $line ]]; do
  number=$((number + 1))
  if [[ $line =~ $open_re ]]; then
    [[ -z $block ]] || die "$template:$number: a <${BASH_REMATCH[1]}> block inside another"
    kind=${BASH_REMATCH[1]}
    block=" ${BASH_REMATCH[2]} "
    continue
  elif [[ $line =~ $close_re ]]; then
    [[ -n $block && ${BASH_REMATCH[1]} == "$kind" ]] || die "$template:$number: </${BASH_REMATCH[1]}> without <${BASH_REMATCH[1]} ...>"
    block="" kind=""
    continue
  fi
  if [[ -n $block ]]; then
    variant=$([[ $kind == capacity ]] && echo "$capacity" || echo "$instance")
    [[ $block == *" $variant "* ]] || continue
  fi
  if [[ $line =~ $sizing_re ]]; then
    sizing_indent=${BASH_REMATCH[1]}
    text+=$sizing_mark$'\n'  # the sizing comments go here once the plan has run
    continue
  fi
  text+=$line$'\n'
  # Placeholders that count are those outside comments (the list at the top names them all).
  [[ $line =~ ^[[:space:]]*# ]] || code+=$line$'\n'
done <"$template"
[[ -z $block ]] || die "$template: a <$kind$block> block is not closed"

# The placeholder names, in order of first use, each once.
names=()
declare -A seen=()
rest=$code
pattern='\$\{([A-Za-z_][A-Za-z0-9_]*)\}'
while [[ $rest =~ $pattern ]]; do
  name=${BASH_REMATCH[1]}
  if [[ -z ${seen[$name]:-} ]]; then
    seen[$name]=1
    names+=("$name")
  fi
  rest=${rest#*"${BASH_REMATCH[0]}"}
done

bad=0
for name in "${names[@]}"; do
  [[ $name == FSX_STORAGE_GIB || $name == FSX_THROUGHPUT_PER_TIB ]] && continue  # computed below
  value=${!name:-}
  if [[ -z $value ]]; then
    echo "render.sh: \${$name} is not set: export $name=... (see the list at the top of $template)" >&2
    bad=1
  elif [[ $name == RESERVED_NODES && ! $value =~ ^[1-9][0-9]*$ ]]; then
    echo "render.sh: \${RESERVED_NODES} = '$value': expected the reservation's instance count, a whole number >= 1" >&2
    bad=1
  elif [[ $name == CAPACITY_RESERVATION_ID && ! $value =~ ^cr-[0-9a-f]+$ ]]; then
    echo "render.sh: \${CAPACITY_RESERVATION_ID} = '$value': expected a reservation id, cr-<hex>" >&2
    bad=1
  elif [[ $value == *[\"\\$'\n\r']* ]]; then
    echo "render.sh: \${$name} = '$value' holds a double quote, backslash or line break; not allowed in cluster.yaml" >&2
    bad=1
  fi
done
((bad == 0)) || exit 2

# --- The plan: exactly these integer lines, each once (format_storage_keys, src/plan). ------
# The run configs name their model preset relative to the repository root (inputs/models/...),
# so the plan runs there, with the config's path made absolute first.
run_abs=$(cd "$(dirname "$run")" && pwd)/$(basename "$run")
jumbo_abs=$(cd "$(dirname "$jumbo")" && pwd)/$(basename "$jumbo")
plan_rest=(--gpu "$gpu" --nodes "$nodes" --storage)
[[ -z $tokens ]] || plan_rest+=(--tokens "$tokens")
[[ -z $data_bytes_given ]] || plan_rest+=(--data-bytes "$data_bytes_given")
plan_args=(plan --config "$run" "${plan_rest[@]}")  # as written in the comments
if ! plan_out=$(cd "$here/.." && "$jumbo_abs" plan --config "$run_abs" "${plan_rest[@]}" 2>&1); then
  die "jumbo ${plan_args[*]} failed: $(tail -n 1 <<<"$plan_out")"
fi
declare -A plan=()
while IFS= read -r line; do
  [[ -n $line ]] || continue
  [[ $line =~ ^([a-z_]+)=([0-9]+)$ ]] || die "jumbo ${plan_args[*]}: unexpected line '$line' (expected KEY=INTEGER)"
  [[ -z ${plan[${BASH_REMATCH[1]}]:-} ]] || die "jumbo ${plan_args[*]}: ${BASH_REMATCH[1]} printed twice"
  plan[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
done <<<"$plan_out"
for key in checkpoint_bytes checkpoints_at_peak data_bytes peak_bytes save_bytes_per_s; do
  [[ -n ${plan[$key]:-} ]] || die "jumbo ${plan_args[*]}: no $key= line"
done

# --- Sizing. Every number below is written into the output as a comment. ---------------------
gib=$((1 << 30))
peak=${plan[peak_bytes]}
# The plan could not see the corpus (its files are in S3, not here): its peak would be
# checkpoints only, and the corpus, loaded onto FSx as it is first read, would not fit.
((plan[data_bytes] > 0)) ||
  die "jumbo plan found no data files for $run (data_bytes=0): pass --data-bytes BYTES, the corpus's size (aws s3 ls --summarize --recursive s3://BUCKET/data/)"
data_note="data_bytes=${plan[data_bytes]} ($([[ -n $data_bytes_given ]] && echo "--data-bytes" || echo "the corpus's files, as the plan found them"))"
# Margin 1.25 (the file system at most 80% full at the peak of a save): Lustre places each file
# on its OSTs, and one full OST fails a write while the file system has room elsewhere; the
# usable size is below the nominal one; and logs, profiles, the jumbo builds and core dumps
# (/fsx/jumbo) are not in the plan.
margin_num=5 margin_den=4
need_gib=$(((peak * margin_num / margin_den + gib - 1) / gib))
# PERSISTENT_2 SSD sizes: 1200 GiB, 2400 GiB, then multiples of 2400 GiB (FSx API
# CreateFileSystem StorageCapacity; the same steps for an increase, UpdateFileSystem).
round_fsx() {
  local want=$1
  if ((want <= 1200)); then echo 1200; else echo $(((want + 2399) / 2400 * 2400)); fi
}
storage_gib=$(round_fsx "$need_gib")
# Throughput per TiB, PERSISTENT_2: 125, 250, 500 or 1000 MB/s/TiB (FSx for Lustre User Guide,
# "Managing throughput capacity"). The file system's throughput is that times its TiB; the
# smallest tier that writes one checkpoint at save_bytes_per_s (the plan's save target) is
# chosen. If even 1000 is too slow, the file system grows until it is fast enough.
save_bps=${plan[save_bytes_per_s]}
throughput=""
for tier in 125 250 500 1000; do
  # MB/s = 10^6 bytes/s; TiB = 1024 GiB.
  if ((tier * 1000000 * storage_gib / 1024 >= save_bps)); then
    throughput=$tier
    break
  fi
done
grown=""
if [[ -z $throughput ]]; then
  throughput=1000
  fast_gib=$(((save_bps * 1024 + 1000 * 1000000 - 1) / (1000 * 1000000)))
  grown=$storage_gib
  storage_gib=$(round_fsx "$fast_gib")
fi
if ((storage_gib > max_capacity)); then
  die "$run on $nodes x $instance needs $storage_gib GiB of FSx (peak $peak bytes x 1.25), more than --max-capacity $max_capacity GiB: lower checkpoint.keep_last/keep_every or use checkpoint.dir = s3://..."
fi
fs_bps=$((throughput * 1000000 * storage_gib / 1024))
save_s=$(((plan[checkpoint_bytes] + fs_bps - 1) / fs_bps))
export FSX_STORAGE_GIB=$storage_gib FSX_THROUGHPUT_PER_TIB=$throughput
tib() { awk -v b="$1" 'BEGIN { printf "%.2f TiB", b / 1099511627776 }'; }
sizing=(
  "jumbo ${plan_args[*]}:"
  "  checkpoint_bytes=${plan[checkpoint_bytes]} ($(tib "${plan[checkpoint_bytes]}") a checkpoint)"
  "  checkpoints_at_peak=${plan[checkpoints_at_peak]} (the one being saved, the kept ones before it, the keep_every ones)"
  "  $data_note"
  "  peak_bytes=${plan[peak_bytes]}: checkpoints_at_peak x checkpoint_bytes + data_bytes"
  "  save_bytes_per_s=${plan[save_bytes_per_s]} (one checkpoint within the plan's save target)"
  "StorageCapacity: $peak bytes ($(tib "$peak")) x 1.25 margin = $need_gib GiB, rounded up to a"
  "  PERSISTENT_2 size (1200, 2400, then steps of 2400 GiB) = $storage_gib GiB"
)
if [[ -n $grown ]]; then
  sizing+=("  (grown from $grown GiB: at 1000 MB/s/TiB that was too slow for save_bytes_per_s)")
fi
sizing+=(
  "PerUnitStorageThroughput: the smallest of 125, 250, 500, 1000 MB/s/TiB with"
  "  $storage_gib/1024 TiB x tier >= save_bytes_per_s: $throughput MB/s/TiB = $fs_bps bytes/s,"
  "  a checkpoint in ~$save_s s if the file system is the bottleneck"
)


comments=""
for comment in "${sizing[@]}"; do comments+="$sizing_indent# $comment"$'\n'; done
text=${text//"$sizing_mark"$'\n'/"$comments"}

for name in "${names[@]}"; do
  # Both sides quoted: the value is literal (bash 5.2 would otherwise expand '&' in it).
  text=${text//"\${$name}"/"${!name}"}
done

# What is left is in comments only (another variant's): the bare name, no "${".
while [[ $text =~ $pattern ]]; do
  text=${text//"${BASH_REMATCH[0]}"/"${BASH_REMATCH[1]}"}
done

# Write beside the target, then rename: OUTPUT is either the old file or the whole new one.
tmp=$(mktemp "${output}.XXXXXX")
trap 'rm -f "$tmp"' EXIT
printf '%s' "$text" >"$tmp"
mv -f "$tmp" "$output"
trap - EXIT
echo "render.sh: wrote $output (capacity $capacity, instance $instance; FSx $storage_gib GiB at $throughput MB/s/TiB; ${#names[@]} placeholders: ${names[*]})"
