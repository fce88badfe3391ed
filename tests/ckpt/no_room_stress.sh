#!/usr/bin/env bash
# ckpt.no_room's case c under stress, outside the default suite (not registered with ctest): a
# dp 2 ZeRO-1 save runs out of space half-way, RUNS times (default 30), each on a fresh tmpfs,
# while a busy loop per core competes with the ranks and their ring threads for the CPUs. Each
# run must end as the contract says (exit 2, the ENOSPC line, step 10 intact) and, strictly,
# with one error line and no crash or MPI transport error: no rank may free or unmap a buffer
# that the other rank's weight gather still reads or writes (issue 38, part 5).
# Prints "no_room_stress: N of RUNS passed"; exits non-zero if any run failed.
# Usage: no_room_stress.sh JUMBO [REPO [RUNS]]   (as root: it mounts tmpfs)
set -uo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 JUMBO [REPO [RUNS]]" >&2
  exit 2
fi
jumbo=$(realpath "$1")
repo=$(realpath "${2:-$(dirname "$0")/../..}")
runs=${3:-30}
cd "$repo" || exit 1
# As ctest runs no_room.sh: as root in a container, more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}

busy=()
stop_busy() {
  local pid
  for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
  busy=()
}
trap stop_busy EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for ((i = 0; i < $(nproc); i++)); do
  (while :; do :; done) &
  busy+=($!)
done
echo "no_room_stress: $runs runs of ckpt.no_room case c, ${#busy[@]} busy loops (PIDs ${busy[*]})"

log=$(mktemp)
NO_ROOM_CASES=c NO_ROOM_C_RUNS=$runs NO_ROOM_C_STRICT=1 \
  bash tests/ckpt/no_room.sh "$jumbo" "$repo" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
stop_busy
passed=$(sed -n "s/^c: \([0-9]*\) of $runs runs passed$/\1/p" "$log")
rm -f "$log"
if [[ -z $passed ]]; then
  echo "no_room_stress: no summary from no_room.sh (exit $status)"
  exit 1
fi
echo "no_room_stress: $passed of $runs passed"
((passed == runs && status == 0))
