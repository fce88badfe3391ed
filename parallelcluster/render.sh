#!/usr/bin/env bash
# Renders the ParallelCluster config: every ${NAME} in the template is replaced by the value of
# the environment variable NAME (like envsubst, restricted to the names the template uses).
# The placeholders are listed at the top of cluster.yaml and in parallelcluster/README.md.
#
#   parallelcluster/render.sh OUTPUT [TEMPLATE]     (TEMPLATE: cluster.yaml beside this script)
#
# A missing or empty variable is reported on one line of its own, naming it; then the script
# exits 2 and writes nothing. Values are written into YAML as they are, so a value holding a
# double quote, a backslash or a line break is refused as well.
set -euo pipefail

usage="usage: render.sh OUTPUT [TEMPLATE]"
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

text=$(<"$template")
# Keep the template's final newline, which $(<) strips.
text+=$'\n'

# The placeholder names, in order of first use, each once.
names=()
declare -A seen=()
rest=$text
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

# Write beside the target, then rename: OUTPUT is either the old file or the whole new one.
tmp=$(mktemp "${output}.XXXXXX")
trap 'rm -f "$tmp"' EXIT
printf '%s' "$text" >"$tmp"
mv -f "$tmp" "$output"
trap - EXIT
echo "render.sh: wrote $output (${#names[@]} placeholders: ${names[*]})"
