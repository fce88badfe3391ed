#!/usr/bin/env bash
# The watchdog ends a job whose rank hangs: within seconds, non-zero, with one line naming the
# rank, the operation and the group. Usage: watchdog.sh PROBE
set -uo pipefail
probe=$1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
timeout 60 mpirun -np 3 --oversubscribe "$probe" >"$log" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
cat "$log"
[[ $status -ne 0 && $status -ne 124 ]] || { echo "FAIL: status $status (124 = still hanging at 60 s)"; exit 1; }
[[ $elapsed -lt 30 ]] || { echo "FAIL: took ${elapsed}s"; exit 1; }
grep -q "barrier on the world group has waited" "$log" || { echo "FAIL: no watchdog line"; exit 1; }
echo "ok: job ended in ${elapsed}s with status $status"
