#!/usr/bin/env bash
# `jumbo serve` on a real checkpoint of the tiny model, driven by a stdlib Python client
# (client.py): 16 concurrent clients (half streaming, greedy and sampled, a stop string) get
# exactly the text `jumbo generate --json` prints for the same prompt, seed, temperature and
# length; a stream closed after its first chunk is cancelled and the server goes on; bad
# requests get 400 naming the field; /v1/models; a full queue gets 429; SIGTERM exits 0;
# under mpirun -np 2 --tp 2 the same request gives the one-rank text. Usage: serve.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
source tests/support/serve_harness.sh
server_pid=
on_exit stop_server_now

check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
# A context of 512: room for a long stream in the disconnect check.
# The chat template rides in the checkpoint (data.chat_template): the server takes it from there.
train_small "$jumbo" 1 "$tmp" --set model.vocab=500 --set model.context=512 \
  --set data.chat_template=inputs/chat/jumbo-chat.toml \
  --set train.global_batch=4 --set train.steps=20 --set checkpoint.every=20 \
  --set "checkpoint.dir=$tmp/ck" --set log.every=100 >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "training run"; finish; }
model=tiny@step_00000020

# ---- the expectations: `jumbo generate --json`, one run per (seed, temperature, length) --
prompts=("The jury said" "In the" "He was a" "It is not")
for p in "${prompts[@]}"; do printf '{"prompt": "%s"}\n' "$p"; done >"$tmp/prompts.jsonl"
groups=("1 0 24 -" "7 0.8 24 -" "11 0.8 40 -" "3 0.8 32 e")  # seed temperature tokens stop
for g in "${!groups[@]}"; do
  read -r seed temp tokens stop <<<"${groups[$g]}"
  stop_flag=()
  [[ $stop != - ]] && stop_flag=(--stop "$stop")
  "$jumbo" generate --checkpoint "$tmp/ck" --prompts "$tmp/prompts.jsonl" --json --seed "$seed" \
    --temperature "$temp" --max-new-tokens "$tokens" "${stop_flag[@]}" >"$tmp/gen_$g.jsonl" \
    2>"$tmp/gen_$g.err" || { cat "$tmp/gen_$g.err"; fail "jumbo generate, group $g"; }
done
python3 - "$tmp" "${groups[@]}" <<'EOF' || fail "building the cases"
import json, sys
tmp, groups = sys.argv[1], sys.argv[2:]
cases = []
for g, spec in enumerate(groups):
    seed, temp, tokens, stop = spec.split()
    for i, line in enumerate(open(f"{tmp}/gen_{g}.jsonl")):
        out = json.loads(line)
        cases.append({"prompt": out["prompt"], "seed": int(seed), "temperature": float(temp),
                      "max_tokens": int(tokens), "stop": None if stop == "-" else [stop],
                      "stream": (i + g) % 2 == 1, "text": out["text"], "tokens": out["tokens"],
                      "finish_reason": out["finish_reason"]})
json.dump(cases, open(f"{tmp}/cases.json", "w"), indent=1)
print(f"{len(cases)} cases, {sum(c['finish_reason'] == 'stop' for c in cases)} ending in stop")
if not any(c["finish_reason"] == "stop" and c["stop"] for c in cases):
    sys.exit("no case ends at its stop string: the stop path is not exercised")
EOF

client() { python3 tests/serve/client.py "$port" "$model" "$@" || fail "client $*"; }

# ---- one rank ---------------------------------------------------------------------------
if start_server one "$jumbo" serve --checkpoint "$tmp/ck" --port 0; then
  client concurrent "$tmp/cases.json"
  client disconnect "$tmp/cases.json"
  client errors "$tmp/cases.json"
  client models
  grep -q "chat template step_00000020 (data.chat_template)" "$tmp/one.out" ||
    fail "one: the checkpoint's chat template was not taken: $(head -1 "$tmp/one.out")"
  python3 - "$port" "$model" <<'EOF' || fail "a chat completion with the checkpoint's template"
import http.client, json, sys
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
conn.request("POST", "/v1/chat/completions", json.dumps({"model": sys.argv[2], "max_tokens": 4,
             "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}))
r = conn.getresponse()
body = json.loads(r.read())
assert r.status == 200 and body["object"] == "chat.completion", (r.status, body)
EOF
  stop_server one TERM
fi

# ---- a log that cannot be written (stderr on a full disk: /dev/full): the
# access lines fail, the server serves on and stops cleanly -------------------------------
"$jumbo" serve --checkpoint "$tmp/ck" --port 0 >"$tmp/nolog.out" 2>/dev/full &
server_pid=$!
port=
for _ in $(seq 600); do
  port=$(grep -oE 'listening on http://127\.0\.0\.1:[0-9]+' "$tmp/nolog.out" | grep -oE '[0-9]+$')
  [[ -n $port ]] && break
  sleep 0.1
done
if [[ -n $port ]]; then
  client models
  client concurrent "$tmp/cases.json"
  kill -TERM "$server_pid"
  wait "$server_pid" || fail "nolog: exited $? after SIGTERM, expected 0"
else
  fail "nolog: no listening line"
fi
server_pid=

# ---- a full queue: one sequence at a time, one request waiting --------------------------
if start_server queue "$jumbo" serve --checkpoint "$tmp/ck" --port 0 --max-batch 1 --max-queue 1; then
  client queue_full
  stop_server queue INT
fi

# ---- tp 2 under mpirun: the same texts as one rank ---------------------------------------
python3 -c 'import json, sys
cases = json.load(open(sys.argv[1]))
plain = [c for c in cases if not c["stop"]]
json.dump([next(c for c in plain if c["temperature"] == 0),
           next(c for c in plain if c["temperature"] > 0)], open(sys.argv[2], "w"))' \
  "$tmp/cases.json" "$tmp/cases_tp.json"
if start_server tp2 mpirun -np 2 "$jumbo" serve --checkpoint "$tmp/ck" --port 0 --tp 2; then
  client concurrent "$tmp/cases_tp.json"
  stop_server tp2 USR1
fi
# pp 2 under NCCL's rules on CPU ranks (comm.emulate): the same texts.
if start_server pp2 mpirun -np 2 "$jumbo" serve --checkpoint "$tmp/ck" --port 0 --pp 2 \
    --comm-emulate nccl; then
  client concurrent "$tmp/cases_tp.json"
  stop_server pp2 USR1
fi

finish "all checks passed"
