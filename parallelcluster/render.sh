#!/usr/bin/env bash
# Renders the ParallelCluster config: every ${NAME} in the template is replaced by the value of
# the environment variable NAME (like envsubst, restricted to the names the template uses).
# The placeholders are listed at the top of cluster.yaml and in parallelcluster/README.md.
#
#   parallelcluster/render.sh [--capacity ondemand|odcr|block] OUTPUT [TEMPLATE]
#       TEMPLATE: cluster.yaml beside this script. --capacity (default ondemand) keeps the
#       template's "# <capacity NAMES>" ... "# </capacity>" blocks that name it and drops the
#       others: odcr = an On-Demand Capacity Reservation, block = a Capacity Block for ML.
#       Only the placeholders left after that must be set.
#
# A missing or empty variable is reported on one line of its own, naming it; then the script
# exits 2 and writes nothing. Values are written into YAML as they are, so a value holding a
# double quote, a backslash or a line break is refused as well.
set -euo pipefail

usage="usage: render.sh [--capacity ondemand|odcr|block] OUTPUT [TEMPLATE]"
capacity=ondemand
if [[ ${1:-} == --capacity ]]; then
  capacity=${2:-}
  shift 2 || true
fi
case $capacity in
  ondemand | odcr | block) ;;
  *)
    echo "render.sh: --capacity '$capacity': expected ondemand, odcr or block" >&2
    exit 2 ;;
esac
if (($# < 1 || $# > 2)) || [[ $1 == -h || $1 == --help ]]; then
  echo "$usage" >&2
  exit 2
fi
output=$1
template=${2:-$(dirname "${BASH_SOURCE[0]}")/cluster.yaml}
if [[ ! -r $template ]]; then
  echo "render.sh: template $template: not readable" >&2
  exit 2
fi

# The variant's lines: outside any block, or inside a block that names it. A block that is
# not closed, or nested, is a broken template: refused with its line number.
text="" code="" block="" number=0
open_re='^[[:space:]]*# <capacity ([a-z ]+)>[[:space:]]*$'
close_re='^[[:space:]]*# </capacity>[[:space:]]*$'
while IFS= read -r line || [[ -n $line ]]; do
  number=$((number + 1))
  if [[ $line =~ $open_re ]]; then
    [[ -z $block ]] || { echo "render.sh: $template:$number: a <capacity> block inside another" >&2; exit 2; }
    block=" ${BASH_REMATCH[1]} "
    continue
  elif [[ $line =~ $close_re ]]; then
    [[ -n $block ]] || { echo "render.sh: $template:$number: </capacity> without <capacity ...>" >&2; exit 2; }
    block=""
    continue
  fi
  [[ -z $block || $block == *" $capacity "* ]] || continue
  text+=$line$'\n'
  # Placeholders that count are those outside comments (the list at the top names them all).
  [[ $line =~ ^[[:space:]]*# ]] || code+=$line$'\n'
done <"$template"
[[ -z $block ]] || { echo "render.sh: $template: a <capacity$block> block is not closed" >&2; exit 2; }

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
echo "render.sh: wrote $output (capacity $capacity; ${#names[@]} placeholders: ${names[*]})"
