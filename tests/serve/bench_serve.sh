#!/usr/bin/env bash
# `jumbo bench serve` on a real checkpoint of the tiny model: two concurrency levels of 12
# streamed requests each get no errors, positive and ordered TTFT and inter-token latency
# percentiles, a positive server/engine decode ratio; no `jumbo serve` child outlives it; a
# bad flag exits 2 with one line naming it. Usage: bench_serve.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh

check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
train_small "$jumbo" 1 "$tmp" --set model.vocab=500 --set model.context=512 \
  --set train.global_batch=4 --set train.steps=20 --set checkpoint.every=20 \
  --set "checkpoint.dir=$tmp/ck" --set log.every=100 >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "training run"; finish; }

"$jumbo" bench serve --checkpoint "$tmp/ck" --concurrency 1 4 --requests 12 --json \
  >"$tmp/bench.out" 2>"$tmp/bench.err" || fail "bench serve exited $?"
cat "$tmp/bench.out" "$tmp/bench.err"
tail -n 1 "$tmp/bench.out" >"$tmp/bench.json"
python3 - "$tmp/bench.json" <<'EOF' || fail "the JSON line"
import json, sys
r = json.loads(open(sys.argv[1]).read())
levels = {l["concurrency"]: l for l in r["levels"]}
assert sorted(levels) == [1, 4], f"levels {sorted(levels)}"
for c, l in levels.items():
    assert l["requests"] == 12 and l["errors"] == 0, f"concurrency {c}: {l}"
    assert l["output_tokens"] > 0 and l["output_tokens_per_s"] > 0, f"concurrency {c}: {l}"
    for key in ("ttft_s", "itl_s"):
        p = l[key]
        assert p["samples"] > 0 and 0 < p["p50"] <= p["p90"] <= p["p99"], f"{c} {key}: {p}"
o = r["overhead"]
assert o["ratio"] > 0 and o["server_decode_tokens_per_s"] > 0, o
assert o["ended_early"] == 0, f"ignore_eos: {o['ended_early']} timed requests ended at EOS"
assert o["engine_decode_tokens_per_s"] > 0 and o["errors"] == 0, o
assert r["errors"] == 0, r["errors"]
print(f"ok: {len(levels)} levels, server/engine {o['ratio']:.3f}")
EOF
if pgrep -f "jumbo serve --checkpoint $tmp/ck" >/dev/null; then
  fail "a jumbo serve child is left: $(pgrep -af "jumbo serve --checkpoint $tmp/ck")"
  for pid in $(pgrep -f "jumbo serve --checkpoint $tmp/ck"); do kill -TERM "$pid"; done
fi

# A bad flag: exit 2, one line naming it, and no server started.
"$jumbo" bench serve --checkpoint "$tmp/ck" --concurrency 0 >"$tmp/bad.out" 2>"$tmp/bad.err"
code=$?
[[ $code == 2 ]] || fail "--concurrency 0 exited $code, expected 2"
[[ $(wc -l <"$tmp/bad.err") == 1 ]] && grep -q -- "--concurrency 0" "$tmp/bad.err" ||
  fail "--concurrency 0: expected one line naming the flag, got: $(cat "$tmp/bad.err")"

finish
