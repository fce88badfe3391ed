#!/usr/bin/env bash
# CloudWatch EMF from a real training run: 2 ranks write nothing, rank 0 writes one line per
# log interval to log.emf_file and the same lines to an agent on tcp://127.0.0.1:PORT (a
# listener this script starts); every line passes tests/obs/validate_emf.py with all the
# declared metrics, and ValLoss appears exactly on the eval steps. Then `jumbo plot` draws the
# run's metrics. Usage: emf_training.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
listener=
on_exit '[[ -z $listener ]] || kill "$listener" 2>/dev/null'
source tests/support/small_run.sh
check "making the small data set" make_small_data "$jumbo" "$tmp" || finish

# A one-connection TCP agent: writes what it receives to a file, says its port first.
python3 - "$tmp/agent.out" "$tmp/agent.port" <<'PY' &
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
s.settimeout(120)
open(sys.argv[2], "w").write(str(s.getsockname()[1]))
conn, _ = s.accept()
conn.settimeout(120)
with open(sys.argv[1], "wb") as out:
    while True:
        data = conn.recv(65536)
        if not data:
            break
        out.write(data)
        out.flush()
PY
listener=$!
for _ in $(seq 1 100); do [[ -s $tmp/agent.port ]] && break; sleep 0.1; done
port=$(cat "$tmp/agent.port")

OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 train_small "$jumbo" 2 "$tmp" \
  --set parallel.tp=2 --set train.steps=12 --set train.global_batch=4 --set log.every=5 \
  --set train.eval_every=6 --set train.eval_batches=2 --set "data.valid=$tmp/data" \
  --set "log.metrics_file=$tmp/metrics.jsonl" --set "log.emf_file=$tmp/emf.jsonl" \
  --set "log.emf_address=tcp://127.0.0.1:$port" --set log.run_name=emf-test \
  --set log.emf_namespace=jumbo-test >"$tmp/log" 2>&1 || { cat "$tmp/log"; fail "training"; }
wait "$listener"
listener=

metrics=Loss,TokensPerSecond,TFLOPsPerDevice,MFU,GradNorm,StepTime,LearningRate,MemoryPeak
if python3 tests/obs/validate_emf.py "$tmp/emf.jsonl" --expect-metrics "$metrics"; then
  echo "ok   EMF file valid with $metrics"
else
  fail "EMF file"
fi
# Steps 1, 5, 6 (eval), 10, 12 (eval, last): one line each, the same bytes over TCP.
if python3 - "$tmp/emf.jsonl" <<'PY'; then
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["Step"] for r in rows]
assert steps == [1, 5, 6, 10, 12], steps
for r in rows:
    declared = {m["Name"] for m in r["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert ("ValLoss" in declared) == (r["Step"] in (6, 12)), r["Step"]
    assert r["RunName"] == "emf-test" and r["Layout"] == "tp2-pp1-dp1", r
    assert r["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "jumbo-test"
PY
  echo "ok   one line per log interval (steps 1 5 6 10 12), ValLoss on eval steps"
else
  fail "EMF lines per interval"
fi
if cmp -s "$tmp/emf.jsonl" "$tmp/agent.out"; then
  echo "ok   the TCP agent received the same lines"
else
  fail "TCP agent lines differ: $(wc -l <"$tmp/agent.out") vs $(wc -l <"$tmp/emf.jsonl")"
fi
if "$jumbo" plot "$tmp/metrics.jsonl" -o "$tmp/loss.svg" >/dev/null &&
  python3 -c "import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])" "$tmp/loss.svg"; then
  echo "ok   jumbo plot of the run's metrics"
else
  fail "plot"
fi
finish
