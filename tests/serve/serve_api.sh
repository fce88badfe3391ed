#!/usr/bin/env bash
# The OpenAI API surface of `jumbo serve` on a real checkpoint of the tiny model:
#  - the official `openai` npm client (openai_sdk.mjs) against a server with --api-key,
#    --api-key-file, --chat-template and --cors-origin: completions (plain, streamed, n,
#    logprobs, echo, include_usage, penalties), chat (plain and streamed), models, a wrong
#    key; its texts equal `jumbo generate --json`'s;
#  - a stdlib + prometheus_client client (api.py): the bug fixes (a completion keeps its first
#    token's leading space; a stop string equal to the first token; deep nesting; 413, 414,
#    431), 404/405, ids unique across restarts, tokenize/detokenize, the new completion
#    fields, CORS, auth, /metrics and the access log; the api key never in the server's logs;
#  - a seeded, bounded fuzz of the request bodies (fuzz.py): 200 or a JSON 4xx, never a 500
#    nor a dropped connection;
#  - https with --tls-cert/--tls-key and a self-signed certificate.
# Every server must exit 0 on SIGTERM. Usage: serve_api.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
# JUMBO_TEST_KEEP=1 keeps the temporary directory (the servers' logs) for a look.
source tests/support/small_run.sh
source tests/support/serve_harness.sh
server_pid=
on_exit stop_server_now
py=/usr/bin/python3  # Debian's: prometheus_client (python3-prometheus-client)
npm_prefix=${JUMBO_NPM_PREFIX:-$HOME/.cache/jumbo/npm}

check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
train_small "$jumbo" 1 "$tmp" --set model.vocab=500 --set model.context=512 \
  --set train.global_batch=4 --set train.steps=20 --set checkpoint.every=20 \
  --set "checkpoint.dir=$tmp/ck" --set log.every=100 >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "training run"; finish; }
model=tiny@step_00000020

# ---- the expectations: `jumbo generate --json` ------------------------------------------
# gen NAME ARGS...: one run into $tmp/gen_NAME.jsonl.
gen() {
  local name=$1
  shift
  "$jumbo" generate --checkpoint "$tmp/ck" --json "$@" >"$tmp/gen_$name.jsonl" \
    2>"$tmp/gen_$name.err" || { cat "$tmp/gen_$name.err"; fail "jumbo generate ($name): $*"; }
}
prompts=("The jury said" "In the" "He was a" "It is not")
for p in "${prompts[@]}"; do printf '{"prompt": "%s"}\n' "$p"; done >"$tmp/prompts.jsonl"
gen greedy --prompts "$tmp/prompts.jsonl" --seed 1 --temperature 0 --max-new-tokens 12
gen sampled --prompts "$tmp/prompts.jsonl" --seed 11 --temperature 0.8 --max-new-tokens 16
gen plain --prompt "The jury said" --seed 7 --temperature 0.8 --max-new-tokens 24
gen penalized --prompt "The jury said" --seed 7 --temperature 0.8 --max-new-tokens 24 \
  --frequency-penalty 2 --presence-penalty 2

# The chat: four messages rendered by the template below, then the generation prompt.
"$py" - "$tmp" <<'EOF' || fail "writing the chat prompt"
import json, sys
tmp = sys.argv[1]
messages = [{"role": "system", "content": "You are a writer."},
            {"role": "user", "content": "Tell me about the jury."},
            {"role": "assistant", "content": "The jury said no."},
            {"role": "user", "content": "And then what did it say?"}]
form = {"system": "System: {content}\n", "user": "User: {content}\n",
        "assistant": "Assistant: {content}\n"}
rendered = "".join(form[m["role"]].replace("{content}", m["content"]) for m in messages)
rendered += "Assistant:"
json.dump({"messages": messages, "rendered": rendered}, open(f"{tmp}/chat.json", "w"))
open(f"{tmp}/chat_prompt.jsonl", "w").write(json.dumps({"prompt": rendered}) + "\n")
EOF
gen chat --prompts "$tmp/chat_prompt.jsonl" --seed 3 --temperature 0.8 --max-new-tokens 16
# The template's stop: two characters of that text whose first occurrence is past its start,
# so the chat's content is the text before them (generate --stop agrees).
chat_stop=$("$py" -c 'import json, sys
t = json.loads(open(sys.argv[1]).readline())["text"]
for k in range(len(t) // 2, 0, -1):
    s = t[k:k + 2]
    if len(s) == 2 and s.strip() and t.find(s) == k and all(" " <= ch and ch not in "\\\"" for ch in s):
        print(s); break' "$tmp/gen_chat.jsonl" 2>/dev/null)
if [[ -z $chat_stop ]]; then
  fail "no stop string can be taken from the chat's text: $(cat "$tmp/gen_chat.jsonl")"
  chat_stop="zzzz"
fi
gen chat_stop --prompts "$tmp/chat_prompt.jsonl" --seed 3 --temperature 0.8 --max-new-tokens 16 \
  --stop "$chat_stop"
cat >"$tmp/chat.toml" <<EOF
system = "System: {content}\n"
user = "User: {content}\n"
assistant = "Assistant: {content}\n"
generation_prompt = "Assistant:"
stop = ["$chat_stop"]
EOF

"$py" - "$tmp" "$model" "$chat_stop" <<'EOF' || fail "building the expectations"
import json, sys
tmp, model, chat_stop = sys.argv[1:]
def runs(name):
    try:
        return [json.loads(line) for line in open(f"{tmp}/gen_{name}.jsonl")]
    except (OSError, json.JSONDecodeError):
        return []
bad = []
greedy, sampled, plain, pen, chat, chat_stop_run = (
    runs(n) for n in ("greedy", "sampled", "plain", "penalized", "chat", "chat_stop"))
expect = {"model": model, "greedy": [], "sampled": [], "plain": None, "penalized": None,
          "chat": None}
for key, outs, seed, temperature, tokens in [("greedy", greedy, 1, 0, 12),
                                             ("sampled", sampled, 11, 0.8, 16)]:
    for g in outs:
        expect[key].append({"prompt": g["prompt"], "seed": seed, "temperature": temperature,
                            "max_tokens": tokens, "text": g["text"], "tokens": g["tokens"],
                            "finish_reason": g["finish_reason"]})
    if len(expect[key]) != 4:
        bad.append(f"jumbo generate gave {len(expect[key])} {key} completions, not 4")
if plain:
    expect["plain"] = {"prompt": plain[0]["prompt"], "seed": 7, "temperature": 0.8,
                       "max_tokens": 24, "text": plain[0]["text"], "tokens": plain[0]["tokens"],
                       "finish_reason": plain[0]["finish_reason"]}
if pen:
    expect["penalized"] = dict(expect["plain"] or {}, frequency_penalty=2.0,
                               presence_penalty=2.0, text=pen[0]["text"],
                               tokens=pen[0]["tokens"], finish_reason=pen[0]["finish_reason"])
    if plain and pen[0]["tokens"] == plain[0]["tokens"]:
        bad.append("jumbo generate: --frequency-penalty 2 --presence-penalty 2 changed nothing: "
                   f"{pen[0]['text']!r}")
c = json.load(open(f"{tmp}/chat.json"))
if chat and chat_stop_run:
    t = chat[0]["text"]
    content = t[:t.find(chat_stop)]
    if chat_stop_run[0]["text"] != content or chat_stop_run[0]["finish_reason"] != "stop":
        bad.append(f"jumbo generate --stop {chat_stop!r}: {chat_stop_run[0]} is not the text "
                   f"before it, {content!r}")
    expect["chat"] = {"messages": c["messages"], "rendered": c["rendered"], "stop": chat_stop,
                      "seed": 3, "temperature": 0.8, "max_tokens": 16, "content": content,
                      "finish_reason": "stop", "text": t}
json.dump(expect, open(f"{tmp}/expect.json", "w"), indent=1)
for b in bad:
    print("FAIL: " + b)
sys.exit(1 if bad else 0)
EOF

api() { "$py" tests/serve/api.py "$@" || fail "api.py $*"; }

# ---- a plain server: no key, no template, no CORS ----------------------------------------
if start_server plain "$jumbo" serve --checkpoint "$tmp/ck" --port 0; then
  api plain "$port" "$tmp/expect.json" --stderr "$tmp/plain.err" --ids "$tmp/ids_plain.txt"
  "$py" tests/serve/fuzz.py "$port" "$model" --count 1500 --seed 1 --budget 60 || fail "fuzz.py (plain)"
  stop_server plain
fi

# ---- keys, a chat template, CORS ---------------------------------------------------------
key1="sk-jumbo-$RANDOM$RANDOM-first"
key2="sk-jumbo-$RANDOM$RANDOM-fromfile"
printf '%s\n' "$key2" >"$tmp/keys.txt"
if start_server full "$jumbo" serve --checkpoint "$tmp/ck" --port 0 --api-key "$key1" \
  --api-key-file "$tmp/keys.txt" --chat-template "$tmp/chat.toml" \
  --cors-origin http://example.test --cors-origin http://other.test; then
  JUMBO_API_KEY=$key1 JUMBO_API_KEY2=$key2 api full "$port" "$tmp/expect.json" \
    --stderr "$tmp/full.err" --ids "$tmp/ids_full.txt" --other-ids "$tmp/ids_plain.txt"
  if [[ -f $npm_prefix/node_modules/openai/package.json ]]; then
    JUMBO_API_KEY=$key1 JUMBO_NPM_PREFIX=$npm_prefix \
      node tests/serve/openai_sdk.mjs "$port" "$tmp/expect.json" || fail "openai_sdk.mjs"
  else
    fail "the openai npm package is not in $npm_prefix (run scripts/install-deps.sh)"
  fi
  JUMBO_API_KEY=$key2 "$py" tests/serve/fuzz.py "$port" "$model" --count 1000 --seed 2 --chat --budget 60 ||
    fail "fuzz.py (chat, with a key)"
  stop_server full
  for k in "$key1" "$key2"; do
    if grep -qF -- "$k" "$tmp/full.out" "$tmp/full.err"; then
      fail "full: an api key appears in the server's output: $(grep -hF -- "$k" "$tmp/full.out" "$tmp/full.err" | head -2)"
    fi
  done
fi

# ---- https --------------------------------------------------------------------------------
if openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -days 1 -keyout "$tmp/tls.key" -out "$tmp/tls.crt" \
  >"$tmp/openssl.log" 2>&1; then
  if start_server tls "$jumbo" serve --checkpoint "$tmp/ck" --port 0 \
    --tls-cert "$tmp/tls.crt" --tls-key "$tmp/tls.key"; then
    grep -q "listening on https://127.0.0.1:$port" "$tmp/tls.out" ||
      fail "tls: the listening line does not say https: $(grep listening "$tmp/tls.out")"
    body=$(curl -sS --max-time 20 --cacert "$tmp/tls.crt" "https://127.0.0.1:$port/v1/models" 2>&1)
    "$py" -c 'import json, sys
d = json.loads(sys.argv[1]); assert d["data"][0]["id"] == sys.argv[2], d' "$body" "$model" \
      2>/dev/null || fail "tls: curl --cacert GET /v1/models: $body"
    code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models")
    [[ $code == 200 ]] && fail "tls: plain http to the https port got a 200"
    if curl -s --max-time 10 -o /dev/null "https://127.0.0.1:$port/v1/models"; then
      fail "tls: curl without the certificate's CA trusted it"
    fi
    api tls "$port" "$tmp/expect.json" --cafile "$tmp/tls.crt"
    stop_server tls
  fi
else
  cat "$tmp/openssl.log"
  fail "openssl req: no self-signed certificate"
fi

finish "all checks passed"
