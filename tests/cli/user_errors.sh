#!/usr/bin/env bash
# The binary's contract for user mistakes: exit status 2 and exactly one line on stderr that
# names the file or key, the value and what was expected. Usage: user_errors.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"

# expect_error NAME PATTERN... -- ARGS: runs jumbo ARGS, checks status 2, one stderr line,
# and that the line contains every PATTERN.
expect_error() {
  local name=$1
  shift
  local patterns=()
  while [[ $1 != -- ]]; do
    patterns+=("$1")
    shift
  done
  shift
  "$jumbo" "$@" >"$tmp/out" 2>"$tmp/err"
  local status=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  local ok=1
  [[ $status -eq 2 ]] || ok=0
  [[ $lines -eq 1 ]] || ok=0
  for p in "${patterns[@]}"; do grep -qF -- "$p" "$tmp/err" || ok=0; done
  if [[ $ok -eq 1 ]]; then
    echo "ok   $name: $(cat "$tmp/err")"
  else
    fail "$name: status $status, $lines stderr lines:"
    cat "$tmp/err"
  fi
}

cat >"$tmp/unknown.toml" <<'TOML'
[train]
lrr = 1e-4
TOML
expect_error unknown-key "$tmp/unknown.toml" "train.lrr" -- train --config "$tmp/unknown.toml"

cat >"$tmp/type.toml" <<'TOML'
[train]
lr = "fast"
TOML
expect_error wrong-type "$tmp/type.toml" "train.lr" "fast" -- train --config "$tmp/type.toml"

expect_error heads-not-dividing "model.heads" "7" -- train --set model.heads=7
expect_error batch-not-divisible "train.global_batch" "33" -- train --set train.global_batch=33
# The architecture keys (model/spec.h): each mistake names the key, its value, what is expected.
llama=(--set model.preset=inputs/models/tiny-llama.toml)
expect_error kv-heads-not-dividing "model.kv_heads = 3" "divisor of model.heads = 4" -- \
  train "${llama[@]}" --set model.kv_heads=3
expect_error kv-heads-not-split-by-tp "parallel.tp = 4" "model.kv_heads = 2" "whole key/value heads" -- \
  train "${llama[@]}" --set parallel.tp=4
expect_error rope-key-on-learned "model.rope_theta = 500000" "model.position = \"learned\"" -- \
  train --set model.rope_theta=500000
expect_error unknown-norm "model.norm" "\"batchnorm\"" "\"layernorm\" or \"rmsnorm\"" -- \
  train --set model.norm=batchnorm
expect_error unknown-mlp "model.mlp" "\"relu\"" "\"gelu\" or \"swiglu\"" -- train --set model.mlp=relu
expect_error odd-rope-head "model.position = \"rope\"" "head size of 15" -- \
  train --set model.d_model=60 --set model.position=rope
expect_error lora-fc1-on-swiglu "finetune.lora_targets = \"qkv,proj,fc1,fc2\"" "swiglu" "gate and up" -- \
  train "${llama[@]}" --set finetune.method=lora --set finetune.lora_targets=qkv,proj,fc1,fc2 \
  --set train.init_from=/nonexistent
expect_error malformed-set "trainlr" -- train --set trainlr
expect_error missing-config "nope.toml" -- train --config "$tmp/nope.toml"
expect_error missing-tokenizer "$tmp/none.model" -- \
  train --set "data.tokenizer=$tmp/none.model"
expect_error missing-preset "missing.toml" "cannot open" -- info --model "$tmp/missing.toml"
expect_error bad-precision "--precision bf17: expected fp32 or bf16" -- \
  bench train --model inputs/models/tiny.toml --precision bf17
# Flags parsed once (src/cli/flags.h): the flag, its value and what it takes; CLI11's own
# errors (an unknown flag, a missing value) are the same one line with exit 2.
expect_error bad-device-flag "--device tpu: expected cpu or cuda" -- \
  generate --checkpoint "$tmp/none" --prompt x --device tpu
expect_error flag-below-range "--nodes 0: expected >= 1" -- plan --model inputs/models/tiny.toml --nodes 0
expect_error bench-steps-range "--steps 0: expected >= 1" -- \
  bench train --model inputs/models/tiny.toml --steps 0
expect_error unknown-flag "--frobnicate" "jumbo train --help" -- train --frobnicate
expect_error flag-without-value "--nodes" "jumbo plan --help" -- plan --model inputs/models/tiny.toml --nodes

expect_error unknown-gpu "train.gpu" "v100" "a100-40gb" -- train --set train.gpu=v100
expect_error unknown-device "train.device" "tpu" -- train --set train.device=tpu
# This build has no CUDA backend (the CUDA build's gpu tests cover that one).
expect_error cuda-not-built "train.device" "-DJUMBO_CUDA=ON" -- train --set train.device=cuda
expect_error emulate-on-gpu "comm.emulate = \"nccl\"" "train.device = \"cuda\"" "expected \"none\"" -- \
  train --set train.device=cuda --set comm.emulate=nccl
expect_error unknown-emulation "comm.emulate" "mpich" -- train --set comm.emulate=mpich
expect_error bad-emulate-flag "--comm-emulate gloo: expected none or nccl" -- \
  generate --checkpoint "$tmp/none" --prompt x --comm-emulate gloo
expect_error bad-emf-address "log.emf_address" "tcp://HOST:PORT" -- \
  train --set log.emf_address=localhost:25888
# J1-Jumbo on one A100: the start-of-run plan refuses it before allocating anything.
expect_error layout-does-not-fit "train.gpu" "does not fit" "GiB of 40.0 GiB" -- \
  train --set model.preset=inputs/models/j1-jumbo.toml --set train.gpu=a100-40gb \
  --set parallel.micro_batch=1 --set train.global_batch=8
expect_error plan-unknown-gpu "--gpu" "tpu" -- plan --model inputs/models/j1-jumbo.toml --gpu tpu --nodes 4
expect_error plan-no-nodes "--nodes" "0" -- plan --model inputs/models/j1-jumbo.toml --nodes 0
expect_error plan-zero-tokens "--tokens" "0" "> 0" -- \
  plan --model inputs/models/j1-jumbo.toml --nodes 128 --tokens 0
expect_error plan-tokens-not-a-number "--tokens" "300B" "finite number" -- \
  plan --model inputs/models/j1-jumbo.toml --nodes 128 --tokens 300B
expect_error plan-infinite-tokens "--tokens" "inf" "finite number" -- \
  plan --model inputs/models/j1-jumbo.toml --nodes 128 --tokens inf
expect_error plan-negative-price "--price-per-node-hour" "-1" ">= 0" -- \
  plan --model inputs/models/j1-jumbo.toml --nodes 128 --tokens 300e9 --price-per-node-hour=-1
expect_error plan-price-not-a-number "--price-per-node-hour" "\$32" "USD >= 0" -- \
  plan --model inputs/models/j1-jumbo.toml --nodes 128 --price-per-node-hour '$32'

# A tokenizer that is not a SentencePiece model.
echo "not a model" >"$tmp/bad.model"
expect_error corrupt-tokenizer "$tmp/bad.model" -- \
  data prepare --input inputs/data/brown-valid.jsonl --tokenizer "$tmp/bad.model" --output "$tmp/x"

# info: J1-Jumbo has 178B parameters within 1%.
if "$jumbo" info --model inputs/models/j1-jumbo.toml | grep -q "(177.87B)"; then
  echo "ok   info-j1-jumbo"
else
  fail "info-j1-jumbo"
fi

# `jumbo` alone: the verbs, one line each, and the usage line, on stdout with exit 0 (as
# --help), nothing on stderr; a word that is no verb: one line naming it and the verbs, exit 2.
"$jumbo" >"$tmp/out" 2>"$tmp/err"
status=$?
ok=1
[[ $status -eq 0 && ! -s $tmp/err ]] || ok=0
grep -q "^Usage: .*jumbo .*SUBCOMMAND" "$tmp/out" || ok=0
for verb in train data generate serve ckpt plan; do
  grep -qE "^  $verb  +[a-z]" "$tmp/out" || ok=0
done
if [[ $ok -eq 1 ]]; then
  echo "ok   bare-jumbo: $(wc -l <"$tmp/out") lines of help"
else
  fail "bare-jumbo: status $status:"
  cat "$tmp/out" "$tmp/err"
fi
expect_error unknown-verb "'frob' is not a verb" "train, info, data" "generate, eval, serve" -- frob

finish
