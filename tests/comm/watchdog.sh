#!/usr/bin/env bash
# The watchdog ends a job whose rank hangs: within seconds, non-zero, with one line naming the
# rank, the operation and the group. Usage: watchdog.sh PROBE
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
probe=$jumbo  # $1: tests/comm/probe/watchdog_probe.cpp
log=$tmp/log
start=$(date +%s)
timeout 60 mpirun -np 3 --oversubscribe "$probe" >"$log" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
cat "$log"
[[ $status -ne 0 && $status -ne 124 ]] || fail "status $status (124 = still hanging at 60 s)"
[[ $elapsed -lt 30 ]] || fail "took ${elapsed}s"
grep -q "barrier on the world group has waited" "$log" || fail "no watchdog line"
finish "job ended in ${elapsed}s with status $status"
