#!/usr/bin/env bash
# Real models' chat templates (tests/data/chat_templates/: Llama 3.1 and 3.2, Mistral v0.3,
# Qwen2.5) rendered by jumbo (`jumbo data render-chat`) and by an implementation nobody here
# wrote, @huggingface/jinja (installed by scripts/install-deps.sh), on 50 seeded conversations
# with and without the generation prompt: byte for byte the same text. Then conversations
# whose roles do not alternate through Mistral's template: both refuse each with the
# template's raise_exception message. Exit 77 (skipped) without node or the package.
# Usage: jinja_templates.sh JUMBO SOURCE_DIR
set -euo pipefail
jumbo=$1
src=$2
npm_prefix=${JUMBO_NPM_PREFIX:-$HOME/.cache/jumbo/npm}
pkg=$npm_prefix/node_modules/@huggingface/jinja/dist/index.js
if ! command -v node > /dev/null || [[ ! -f $pkg ]]; then
  echo "SKIP: needs node and @huggingface/jinja ($pkg; scripts/install-deps.sh installs it)"
  exit 77
fi
helper=$src/tests/data/jinja_templates.mjs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

node "$helper" gen 20240726 50 "$tmp/conversations.jsonl"
failed=0
for config in "$src"/tests/data/chat_templates/*/tokenizer_config.json; do
  model=$(basename "$(dirname "$config")")
  for gen in 0 1; do
    flag=()
    [[ $gen == 1 ]] && flag=(--add-generation-prompt)
    node "$helper" render "$pkg" "$config" "$tmp/conversations.jsonl" $gen "$tmp/ref.jsonl"
    rc=0
    "$jumbo" data render-chat --chat-template "$config" --input "$tmp/conversations.jsonl" "${flag[@]}" \
      > "$tmp/jumbo.jsonl" 2> "$tmp/jumbo.err" || rc=$?
    if [[ $rc -ne 0 && $rc -ne 1 ]]; then
      echo "$model: jumbo data render-chat exited $rc:"; cat "$tmp/jumbo.err"; failed=1; continue
    fi
    node "$helper" compare "$tmp/ref.jsonl" "$tmp/jumbo.jsonl" "$model, add_generation_prompt=$gen" || failed=1
  done
done

# raise_exception: Mistral's template refuses roles that do not alternate, in its own words.
mistral=$src/tests/data/chat_templates/Mistral-7B-Instruct-v0.3/tokenizer_config.json
node "$helper" gen 7 10 "$tmp/violating.jsonl" violating
node "$helper" render "$pkg" "$mistral" "$tmp/violating.jsonl" 1 "$tmp/ref.jsonl"
rc=0
"$jumbo" data render-chat --chat-template "$mistral" --input "$tmp/violating.jsonl" --add-generation-prompt \
  > "$tmp/jumbo.jsonl" 2> "$tmp/jumbo.err" || rc=$?
node "$helper" compare "$tmp/ref.jsonl" "$tmp/jumbo.jsonl" "Mistral-7B-Instruct-v0.3, roles not alternating" || failed=1
expected="After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."
refused=$(grep -cF "{\"error\":\"$expected\"}" "$tmp/jumbo.jsonl" || true)
if [[ $rc -ne 1 || $refused -ne 10 ]]; then
  echo "Mistral, roles not alternating: expected exit 1 and 10 refusals with the template's message, got exit $rc and $refused"
  cat "$tmp/jumbo.err"
  failed=1
fi
grep -q "refused 10 of the conversations" "$tmp/jumbo.err" || { echo "no summary line on stderr:"; cat "$tmp/jumbo.err"; failed=1; }
[[ $failed == 0 ]] && echo "jinja_templates: all identical"
exit $failed
