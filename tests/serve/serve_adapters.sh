#!/usr/bin/env bash
# Many LoRA adapters over one base (docs/serve.md "Adapters"), on a real base checkpoint of
# the tiny model and three LoRA fine-tunes of it (ranks 4, 8, 2 on different maps):
#   - `jumbo generate --adapter` gives each model's expected texts (greedy and seeded);
#   - `jumbo serve --adapter a1=.. --adapter a2=.. --max-adapters 3`: /v1/models lists the
#     base and both; a3 added with POST /v1/adapters answers the next request;
#   - 16 concurrent requests over the base and the three adapters, in mixed batches
#     (jumbo_mixed_adapter_steps_total > 0), give the same texts as each request alone and
#     as jumbo generate; the adapters' texts differ from the base's;
#   - the official `openai` npm client (adapters_sdk.mjs) lists, retrieves and completes with
#     the adapters by name;
#   - refused adapters (a taken name or slot, a full checkpoint, an adapter of another base, a
#     bad name, no checkpoint): 409 or 400 with one line, and the server stays up;
#   - a seeded fuzz of the adapter routes (odd names, paths, bodies; adds and deletes under
#     completions naming the adapters): never a 5xx;
#   - DELETE of an adapter with a stream in flight: the stream ends with its text, new
#     requests get 404, the freed slot takes another adapter;
#   - under mpirun -np 4 --tp 2 --pp 2 (each stage reads its part of an adapter added while
#     serving) the same texts;
#   - jumbo bench generate --adapters measures the base alone and a batch over adapters;
#   - mistakes in the flags: one line, exit non-zero.
# Usage: serve_adapters.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
source tests/support/small_run.sh
source tests/support/serve_harness.sh
server_pid=
on_exit stop_server_now
export OMPI_MCA_rmaps_base_oversubscribe=1
npm_prefix=${JUMBO_NPM_PREFIX:-$HOME/.cache/jumbo/npm}

check "making the small data set" make_small_data "$jumbo" "$tmp" || finish
ctx=(--set model.vocab=500 --set model.context=128 --set train.global_batch=8 --set log.every=100)
train_small "$jumbo" 1 "$tmp" "${ctx[@]}" --set train.steps=40 --set train.lr=3e-3 \
  --set checkpoint.every=40 --set "checkpoint.dir=$tmp/base" >"$tmp/base.log" 2>&1 ||
  { cat "$tmp/base.log"; fail "base training run"; finish; }
model=tiny@step_00000040

# Three LoRA fine-tunes of the base (on the same documents, at a high learning rate, so their
# texts part from the base's within a few steps), and one of another base.
lora() {
  local name=$1 base=$2 rank=$3 targets=$4 seed=$5 np=${6:-1}
  shift $(($# < 6 ? $# : 6))
  train_small "$jumbo" "$np" "$tmp" "${ctx[@]}" "$@" --set "train.init_from=$base" \
    --set finetune.method=lora --set "finetune.lora_rank=$rank" \
    --set "finetune.lora_alpha=$((2 * rank))" --set "finetune.lora_targets=$targets" \
    --set train.lr=2e-2 --set train.warmup_tokens=0 --set train.steps=12 --set "train.seed=$seed" \
    --set checkpoint.every=12 --set "checkpoint.dir=$tmp/$name" >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log"; fail "LoRA fine-tune $name"; return 1; }
}
lora a1 "$tmp/base" 4 qkv,proj,fc1,fc2 1 && lora a2 "$tmp/base" 8 qkv,fc2 2 &&
  lora a3 "$tmp/base" 2 proj,fc1 3 || finish
train_small "$jumbo" 1 "$tmp" "${ctx[@]}" --set train.steps=4 --set checkpoint.every=4 \
  --set "checkpoint.dir=$tmp/other" >/dev/null 2>&1 && lora foreign "$tmp/other" 4 qkv 4 || finish
# Saved by two pipeline stages (a shard per stage), for a load that fails on one stage only.
lora staged "$tmp/base" 4 qkv 5 2 --set parallel.pp=2 || finish

# ---- expectations: jumbo generate [--adapter], per model and (seed, temperature) ---------
prompts=("The jury said" "In the" "He was a" "It is not")
for p in "${prompts[@]}"; do printf '{"prompt": "%s"}\n' "$p"; done >"$tmp/prompts.jsonl"
for m in base a1 a2 a3; do
  adapter=()
  [[ $m != base ]] && adapter=(--adapter "$tmp/$m")
  for spec in "1 0 16" "7 0.9 24"; do
    read -r seed temp tokens <<<"$spec"
    "$jumbo" generate --checkpoint "$tmp/base" "${adapter[@]}" --prompts "$tmp/prompts.jsonl" \
      --json --seed "$seed" --temperature "$temp" --max-new-tokens "$tokens" \
      >"$tmp/gen_${m}_$seed.jsonl" 2>"$tmp/gen.err" || { cat "$tmp/gen.err"; fail "generate $m"; }
  done
done
python3 - "$tmp" "$model" <<'EOF' || fail "building the cases"
import json, sys
tmp, base = sys.argv[1:3]
cases = []
for m in ["base", "a1", "a2", "a3"]:
    for seed, temp, tokens in [(1, 0.0, 16), (7, 0.9, 24)]:
        for line in open(f"{tmp}/gen_{m}_{seed}.jsonl"):
            out = json.loads(line)
            cases.append({"model": base if m == "base" else m, "prompt": out["prompt"],
                          "seed": seed, "temperature": temp, "max_tokens": tokens,
                          "text": out["text"]})
greedy = [c for c in cases if c["temperature"] == 0]
json.dump(greedy, open(f"{tmp}/cases16.json", "w"), indent=1)
json.dump(cases, open(f"{tmp}/cases.json", "w"), indent=1)
json.dump([c for c in greedy if c["model"] != "a3"], open(f"{tmp}/cases12.json", "w"), indent=1)
json.dump([dict(c, model="a2b") for c in cases if c["model"] == "a2"],
          open(f"{tmp}/cases_a2b.json", "w"), indent=1)
texts = {m: [c["text"] for c in cases if c["model"] == m] for m in {c["model"] for c in cases}}
for m in ["a1", "a2", "a3"]:
    if texts[m] == texts[base]:
        sys.exit(f"adapter {m} gives the base's texts: the adapters would not be tested")
print(f"{len(cases)} cases; {len(greedy)} greedy ones, one per model and prompt")
EOF

client() { python3 tests/serve/adapters_client.py "$port" "$model" "$@" || fail "client $*"; }
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

# ---- one rank: two adapters at start, a third added while serving -----------------------
if start_server one "$jumbo" serve --checkpoint "$tmp/base" --port 0 --max-batch 16 \
  --adapter "a1=$tmp/a1" --adapter "a2=$tmp/a2" --max-adapters 3; then
  grep -q "2 of 3 adapter slots (LoRA rank <= 8)" "$tmp/one.out" || fail "the start line: $(head -1 "$tmp/one.out")"
  client models a1 a2
  client add a3 "$tmp/a3"
  client one "$tmp/cases.json" a3
  client models a1 a2 a3
  client batch "$tmp/cases16.json"
  client batch "$tmp/cases.json"
  if [[ -f $npm_prefix/node_modules/openai/package.json ]]; then
    JUMBO_NPM_PREFIX=$npm_prefix node tests/serve/adapters_sdk.mjs "$port" "$model" \
      "$tmp/cases16.json" || fail "adapters_sdk.mjs"
  else
    fail "the openai npm package is not in $npm_prefix (run scripts/install-deps.sh)"
  fi
  mixed=$(metric jumbo_mixed_adapter_steps_total)
  [[ ${mixed:-0} -gt 0 ]] || fail "no engine step mixed adapters (jumbo_mixed_adapter_steps_total = ${mixed:-none})"
  echo "engine steps that mixed models: $mixed"
  client refused 409 "is served" a1 "$tmp/a1"
  client refused 409 "every adapter slot is taken .--max-adapters 3" a4 "$tmp/a1"
  client refused 400 "expected letters" "bad/name" "$tmp/a1"
  client remove_in_flight "$tmp/cases.json" a2
  client models a1 a3
  client refused 400 "not a LoRA checkpoint" a4 "$tmp/base"
  client refused 400 "trained on the base .*other.* but the served base .* has fingerprint" a4 "$tmp/foreign"
  client refused 400 "nowhere" a4 "$tmp/nowhere"
  # Hostile bodies on the adapter routes, adapters coming and going (one slot is free) under
  # completions naming them: never a 5xx, never a dropped connection. Then its adapters go.
  /usr/bin/python3 tests/serve/fuzz.py "$port" "$model" --count 400 --seed 3 --budget 120 \
    --adapter-path "$tmp/a3" || fail "fuzz of the adapter routes"
  for n in fz0 fz1 fz2; do curl -s -X DELETE "http://127.0.0.1:$port/v1/adapters/$n" >/dev/null; done
  added=$(grep -c "jumbo serve: adapter fz[0-9] loaded" "$tmp/one.err")
  freed=$(grep -c "jumbo serve: adapter slot . freed" "$tmp/one.err")
  echo "fuzz: $added adapters loaded, slots freed $freed times so far"
  ((added >= 3)) || fail "the fuzz loaded $added adapters: its adds and deletes did not churn"
  client add a2b "$tmp/a2"
  client one "$tmp/cases_a2b.json" a2b
  grep -q "adapter slot 1 freed" "$tmp/one.err" || fail "the log does not say a2's slot was freed"

  stop_server one
fi

# ---- tp 2 x pp 2: adapters read per stage, one added through the followers ---------------
if start_server grid mpirun -np 4 "$jumbo" serve --checkpoint "$tmp/base" --port 0 \
  --tp 2 --pp 2 --max-batch 16 --adapter "a1=$tmp/a1" --max-adapters 2 --max-lora-rank 8; then
  client refused 400 "not a LoRA checkpoint" a2 "$tmp/base"
  # A shard that only the second stage reads is damaged: the ranks of both stages drop the load
  # alike (the first stage read its part) and the server goes on.
  cp -r "$tmp/staged" "$tmp/damaged"
  [[ -f $tmp/damaged/step_00000012/tp0-pp1-dp0.h5 ]] || fail "the two-stage adapter has no stage-1 shard"
  truncate -s 100 "$tmp"/damaged/step_00000012/tp0-pp1-dp0.h5
  client refused 400 "tp0-pp1-dp0.h5" a2 "$tmp/damaged"
  client add a2 "$tmp/a2"
  client batch "$tmp/cases12.json"
  stop_server grid USR1
fi

# ---- jumbo bench generate --adapters: the base alone and a batch over two adapters --------
"$jumbo" bench generate -m inputs/models/tiny.toml --batch 4 --prompt 8 --new-tokens 4 \
  --repeats 1 --adapters 2 --lora-rank 4 >"$tmp/bench.out" 2>&1 || { cat "$tmp/bench.out"; fail "bench generate --adapters"; }
python3 - "$tmp/bench.out" <<'EOF' || fail "bench generate --adapters: its rows"
import json, sys
rows = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["rows"]
assert [(r["batch"], r["adapters"]) for r in rows] == [(4, 0), (4, 2)], rows
assert all(r["decode_tokens_per_s"] > 0 for r in rows), rows
EOF

# ---- mistakes at start: one line each, exit non-zero ---------------------------------------
expect_start_error() {
  local pattern=$1
  shift
  "$jumbo" serve --checkpoint "$tmp/base" --port 0 "$@" >"$tmp/bad.out" 2>"$tmp/bad.err" &&
    { fail "serve $* started"; return; }
  grep -qE -- "$pattern" "$tmp/bad.err" || fail "serve $*: $(cat "$tmp/bad.err"), expected /$pattern/"
}
expect_start_error "--adapter a1: expected NAME=PATH" --adapter a1
expect_start_error "--adapter x/y=.*: the name expected letters" --adapter "x/y=$tmp/a1"
expect_start_error "--adapter a1=.*a2: the name a1 is given twice" --adapter "a1=$tmp/a1" --adapter "a1=$tmp/a2"
expect_start_error "--adapter a=.*base: .*not a LoRA checkpoint" --adapter "a=$tmp/base"
expect_start_error "--adapter f=.*foreign: .*trained on the base" --adapter "f=$tmp/foreign"
expect_start_error "--adapter a2=.*: .*LoRA rank 8 is above --max-lora-rank 4" --adapter "a2=$tmp/a2" --max-lora-rank 4
expect_start_error "--max-adapters 1: expected at least the 2 adapters given" \
  --adapter "a1=$tmp/a1" --adapter "a2=$tmp/a2" --max-adapters 1
finish
