#!/usr/bin/env bash
# The straggler report on 4 real ranks (dp 4): world rank 2 is slowed by 150 ms a step
# (JUMBO_TEST_FAULT=slow@2:150); with log.every = 2 and log.straggler_intervals = 2 the report
# names it, with its host name, at the second interval (step 4) and not before; the JSON
# metrics carry the per-rank spread and the straggler; the EMF lines (valid for CloudWatch)
# carry StragglerRatio and Stragglers at each interval. The start-up placement line names the host.
# Usage: stragglers.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
host=$(hostname)

JUMBO_TEST_FAULT=slow@2:150 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  train_small "$jumbo" 4 "$tmp" --set train.steps=6 --set train.global_batch=4 \
  --set log.every=2 --set log.straggler_intervals=2 --set "log.metrics_file=$tmp/metrics.jsonl" \
  --set "log.emf_file=$tmp/emf.jsonl" >"$tmp/log" 2>&1 || { cat "$tmp/log"; fail "training"; }

if grep -q "^placement: 1 host ($host: 4 ranks); tp = 1$" "$tmp/log"; then
  echo "ok   placement: 1 host ($host: 4 ranks)"
else
  fail "placement line: $(grep '^placement' "$tmp/log")"
fi
report=$(grep -m1 '^straggler: ' "$tmp/log")
if [[ $report == "straggler: rank 2 on host $host computed "*"x its stage's median for 2 intervals in a row (log.straggler_ratio = 1.25)" ]]; then
  echo "ok   $report"
else
  cat "$tmp/log"
  fail "straggler line: '$report'"
fi
# Named at step 4 (the second interval), not at step 2; the slowest rank at every interval.
if python3 - "$tmp/metrics.jsonl" <<'PY'; then
import json, sys
rows = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
assert "ranks" not in rows[1] and "ranks" not in rows[3], "ranks only at log intervals"
for step in (2, 4, 6):
    t = rows[step]["ranks"]
    assert t["slowest_rank"] == 2, (step, t)
    assert t["compute_s"]["max"] > 1.25 * t["compute_s"]["median"], (step, t)
    assert t["wait_s"]["median"] > t["wait_s"]["min"], (step, t)
assert rows[2]["ranks"]["stragglers"] == [], rows[2]["ranks"]
for step, intervals in ((4, 2), (6, 3)):
    s = rows[step]["ranks"]["stragglers"]
    assert [x["rank"] for x in s] == [2] and s[0]["intervals"] == intervals, (step, s)
PY
  echo "ok   metrics: slowest rank 2 each interval, flagged at steps 4 and 6, not 2"
else
  fail "metrics ranks"
fi
if python3 tests/obs/validate_emf.py "$tmp/emf.jsonl" --expect-metrics Anomalies &&
  python3 - "$tmp/emf.jsonl" <<'PY'; then
import json, sys
rows = {r["Step"]: r for r in map(json.loads, open(sys.argv[1]))}
assert rows[2]["Stragglers"] == 0 and rows[4]["Stragglers"] == 1, rows
assert rows[4]["StragglerRatio"] > 1.25 and rows[4]["Anomalies"] == 0, rows[4]
PY
  echo "ok   EMF: Stragglers 0 at step 2, 1 at step 4"
else
  fail "EMF straggler metrics"
fi
finish
