#!/usr/bin/env bash
# NCCL's rules on CPU ranks: a program that deadlocks under NCCL (both ranks send first, in
# separate groups) completes under MPI and, under comm.emulate = nccl, is ended by the
# watchdog within seconds with its one line naming the operation and the group.
# Usage: nccl_rules_deadlock.sh PROBE
source "$(dirname "$0")/../support/harness.sh" "$@"
stop_at_first_failure
probe=$jumbo  # $1: tests/comm/probe/nccl_rules_deadlock.cpp
log=$tmp/log
timeout 60 mpirun -np 2 --oversubscribe "$probe" mpi >"$log" 2>&1 || { cat "$log"; fail "MPI: status $?"; }
grep -q "rank 1 received 0" "$log" || { cat "$log"; fail "MPI: rank 1 did not receive rank 0's value"; }
start=$(date +%s)
timeout 60 mpirun -np 2 --oversubscribe "$probe" nccl >"$log" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
cat "$log"
[[ $status -ne 0 && $status -ne 124 ]] || fail "NCCL rules: status $status (124 = still hanging at 60 s)"
[[ $elapsed -lt 30 ]] || fail "took ${elapsed}s"
grep -q "wait for a receive of a point-to-point group on the world group has waited" "$log" ||
  fail "no watchdog line naming the wait and the group"
grep -q "received" "$log" && fail "a rank got past the deadlock"
finish "MPI completes; NCCL's rules deadlock and the watchdog ends the job in ${elapsed}s (status $status)"
