#!/usr/bin/env bash
# `jumbo plan` and `jumbo doctor` as a user runs them. Usage: plan_doctor.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
pass() { echo "ok   $1"; }

# J1-Jumbo on 64 p4d nodes: layouts fit, the recommendation is tp 8 within the node, and its
# estimate is under 40 GiB.
"$jumbo" plan --model inputs/models/j1-jumbo.toml --gpu a100-40gb --nodes 64 >"$tmp/plan" 2>&1
status=$?
if [[ $status -eq 0 ]] && grep -q "^recommended: tp 8 x pp" "$tmp/plan" &&
  grep -Eq "memory: [0-9.]+ GiB of 40.0 GiB per A100-SXM4-40GB: weights" "$tmp/plan"; then
  pass "plan j1-jumbo 64 nodes: $(grep '^recommended' "$tmp/plan")"
else
  fail "plan j1-jumbo 64 nodes (status $status)"
  cat "$tmp/plan"
fi
# Rows are sorted fastest first (highest estimated MFU: the same GPUs run the same FLOPs),
# every one is within 40 GiB and names what bounds it.
if python3 - "$tmp/plan" <<'PY'; then
import re, sys
rows = [m.groups() for m in (re.search(r"\|\s+([0-9.]+) \|\s+[0-9.]+%\s+[0-9.e+-]+ +([0-9.]+)% \| (\w+)", l)
                             for l in open(sys.argv[1])) if m]
assert rows, "no rows"
totals = [float(r[0]) for r in rows]
mfus = [float(r[1]) for r in rows]
assert mfus == sorted(mfus, reverse=True), mfus
assert max(totals) <= 40.0, totals
assert all(r[2] in ("compute", "memory", "bubble", "comm") for r in rows), rows
PY
  pass "plan rows sorted fastest first, all <= 40 GiB, each with its bound"
else
  fail "plan rows"
fi
# --tokens adds days, GPU-hours and cost, and the recommendation states them.
"$jumbo" plan --model inputs/models/j1-jumbo.toml --gpu a100-40gb --nodes 128 --tokens 300e9 \
  --price-per-node-hour 40 >"$tmp/cost" 2>&1
status=$?
if [[ $status -eq 0 ]] && grep -q "|   days   GPU-h    cost$" "$tmp/cost" &&
  grep -q "^time to train 300B tokens: 95368 steps of 1536 x 2048 tokens; cost at \$40.00 per node-hour$" "$tmp/cost" &&
  grep -Eq "^recommended: .*; [0-9.]+ days and \\\$[0-9.]+M for 300B tokens;" "$tmp/cost"; then
  pass "plan --tokens: $(grep '^  time:' "$tmp/cost")"
else
  fail "plan --tokens (status $status)"
  cat "$tmp/cost"
fi
best=$("$jumbo" plan --model inputs/models/j1-jumbo.toml --gpu a100-40gb --nodes 64 --best)
if [[ $best =~ ^--set\ parallel.tp=8\ --set\ parallel.pp=[0-9]+ ]]; then
  pass "plan --best: $best"
else
  fail "plan --best: '$best'"
fi
# The overrides it prints are accepted by the run config loader.
# shellcheck disable=SC2086
if "$jumbo" info --config inputs/runs/demo.toml --set model.preset=inputs/models/j1-jumbo.toml $best >/dev/null; then
  pass "plan --best overrides load"
else
  fail "plan --best overrides load"
fi
"$jumbo" plan --model inputs/models/j1-jumbo.toml --nodes 1 >"$tmp/none" 2>&1
status=$?
if [[ $status -eq 1 ]] && grep -q "none of the" "$tmp/none"; then
  pass "plan: nothing fits on one node (exit 1)"
else
  fail "plan on one node: status $status"
  cat "$tmp/none"
fi

# doctor: this machine has no EFA and no GPU; with a writable directory it passes.
"$jumbo" doctor --dir "$tmp/shared" >"$tmp/doctor" 2>&1
status=$?
if [[ $status -eq 0 ]] && grep -q "^ok    mpi " "$tmp/doctor" &&
  grep -q "^ok    libfabric  libfabric .*providers .*tcp" "$tmp/doctor" &&
  grep -q "^ok    storage    $tmp/shared" "$tmp/doctor" && [[ -z $(ls -A "$tmp/shared") ]]; then
  pass "doctor passes and leaves nothing behind"
else
  fail "doctor (status $status)"
  cat "$tmp/doctor"
fi
"$jumbo" doctor --expect-efa >"$tmp/efa" 2>&1
status=$?
if [[ $status -eq 1 ]] && grep -q "^FAIL  libfabric .*no efa" "$tmp/efa"; then
  pass "doctor --expect-efa fails without EFA (exit 1)"
else
  fail "doctor --expect-efa: status $status"
  cat "$tmp/efa"
fi
mkdir -p "$tmp/ro" && chmod 0555 "$tmp/ro"
if [[ $(id -u) -ne 0 ]]; then
  "$jumbo" doctor --dir "$tmp/ro" >"$tmp/ro.out" 2>&1
  status=$?
  if [[ $status -eq 1 ]] && grep -q "^FAIL  storage" "$tmp/ro.out"; then
    pass "doctor: read-only directory fails"
  else
    fail "doctor read-only: status $status"
  fi
fi
# The network plugin NCCL would load, by NCCL's rules (NCCL_NET_PLUGIN unset: libnccl-net.so;
# set: NAME, libnccl-net-NAME.so), found through LD_LIBRARY_PATH: plugins made here, one with the
# ncclNetPlugin_v8 symbol NCCL looks for and one without.
if command -v cc >/dev/null; then
  mkdir -p "$tmp/plugin" "$tmp/empty"
  echo 'int ncclNetPlugin_v8[4];' >"$tmp/plugin.c"
  echo 'int not_a_plugin;' >"$tmp/empty.c"
  cc -shared -fPIC -o "$tmp/plugin/libnccl-net.so" "$tmp/plugin.c" &&
    cc -shared -fPIC -o "$tmp/empty/libnccl-net.so" "$tmp/empty.c" || fail "cc -shared"
  LD_LIBRARY_PATH=$tmp/plugin "$jumbo" doctor >"$tmp/net" 2>&1
  if grep -Eq "^ok    nccl-net   NCCL_NET_PLUGIN unset: .* loads libnccl-net.so = $tmp/plugin/libnccl-net.so \(ncclNetPlugin_v8\)$" "$tmp/net"; then
    pass "doctor names the plugin file NCCL would load"
  else
    fail "doctor with a plugin on LD_LIBRARY_PATH"
    cat "$tmp/net"
  fi
  # aws-ofi-nccl 1.14 has no libnccl-net-ofi.so: NCCL_NET_PLUGIN=ofi loses the plugin.
  NCCL_NET_PLUGIN=ofi LD_LIBRARY_PATH=$tmp/plugin "$jumbo" doctor --expect-efa >"$tmp/ofi" 2>&1
  status=$?
  if [[ $status -eq 1 ]] && [[ $(grep -Ec "^(ok|warn|FAIL|skip) +nccl-net " "$tmp/ofi") -eq 1 ]] &&
    grep -Eq "^FAIL  nccl-net   NCCL_NET_PLUGIN=ofi: .*libnccl-net-ofi.so, not found: searched LD_LIBRARY_PATH=$tmp/plugin, then .*; libnccl-net.so loads \($tmp/plugin/libnccl-net.so\): unset NCCL_NET_PLUGIN to use it; NCCL would use its socket transport between nodes$" "$tmp/ofi"; then
    pass "doctor: NCCL_NET_PLUGIN=ofi without libnccl-net-ofi.so fails in one line naming both"
  else
    fail "doctor with NCCL_NET_PLUGIN=ofi (status $status)"
    cat "$tmp/ofi"
  fi
  LD_LIBRARY_PATH=$tmp/empty "$jumbo" doctor --expect-efa >"$tmp/nosym" 2>&1
  if grep -q "^FAIL  nccl-net   .*$tmp/empty/libnccl-net.so exports no ncclNetPlugin_vN symbol, so NCCL ignores it" "$tmp/nosym"; then
    pass "doctor: a libnccl-net.so without ncclNetPlugin_vN fails"
  else
    fail "doctor with a plugin lacking the symbol"
    cat "$tmp/nosym"
  fi
fi
# Under mpirun: one report from rank 0, every rank counted.
mpirun -np 2 --oversubscribe "$jumbo" doctor --dir "$tmp/shared" >"$tmp/mpi" 2>&1
status=$?
if [[ $status -eq 0 ]] && grep -q "^doctor: 2 ranks checked, 0 with a failed check" "$tmp/mpi" &&
  [[ $(grep -c "^ok    mpi" "$tmp/mpi") -eq 1 ]]; then
  pass "doctor under mpirun -np 2"
else
  fail "doctor under mpirun (status $status)"
  cat "$tmp/mpi"
fi

finish
