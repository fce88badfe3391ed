#!/usr/bin/env bash
# `jumbo data tokenizer` then `jumbo data inspect-tokenizer`: a small tokenizer trained on a
# sample of the validation text, its report fields, and user errors as exit 2 and one line.
# Seconds: vocabulary 400, 64 KiB sample. Usage: tokenizer_inspect.sh JUMBO REPO
source "$(dirname "$0")/../support/harness.sh" "$@"
valid=inputs/data/brown-valid.jsonl

"$jumbo" data tokenizer -i "$valid" -o "$tmp/tok" --vocab-size 400 --sample-bytes 64K \
  --max-piece-length 24 --threads 2 >"$tmp/out" 2>"$tmp/err"
status=$?
[[ $status -eq 0 ]] || fail "training exited $status: $(cat "$tmp/err")"
cat "$tmp/out"
# 64 KiB of the 0.29 MiB of text; peak RSS is printed in GiB.
grep -qE "^sampled [0-9]+ sentences \(0\.1 MiB\) of 0\.3 MiB read from 1 file in " "$tmp/out" ||
  fail "sampling line: $(cat "$tmp/out")"
grep -qE "^wrote $tmp/tok\.model: 400 pieces in [0-9.]+ s .*peak RSS [0-9.]+ GiB$" "$tmp/out" ||
  fail "summary line: $(cat "$tmp/out")"

"$jumbo" data inspect-tokenizer "$tmp/tok.model" --sample "$valid" --top 5 >"$tmp/out" 2>"$tmp/err"
status=$?
[[ $status -eq 0 ]] || fail "inspect exited $status: $(cat "$tmp/err")"
cat "$tmp/out"
grep -qx "vocabulary: 400 pieces (141 learned, 256 byte, 3 control/unknown)" "$tmp/out" ||
  fail "vocabulary line"
multi=$(sed -nE 's/^multi-word pieces: ([0-9]+) of 141 learned .*/\1/p' "$tmp/out")
[[ -n $multi && $multi -ge 1 ]] || fail "multi-word pieces: '$multi'"
longest=$(sed -n '/^longest pieces/,/^sample/p' "$tmp/out" | grep -cE '^ +[0-9]+  ')
[[ $longest -eq 5 ]] || fail "$longest longest pieces shown, expected 5"
# Every shown length is at most --max-piece-length, and the list runs longest first.
sed -n '/^longest pieces/,/^sample/p' "$tmp/out" |
  awk '/^ +[0-9]+  / { if ($1 > 24 || (prev && $1 > prev)) bad = 1; prev = $1 } END { exit bad }' ||
  fail "longest pieces not sorted or over 24 characters"
grep -qE "^sample $valid: 25 documents, [0-9]+ words, [0-9]+ tokens, [0-9]+ bytes$" "$tmp/out" ||
  fail "sample line"
tpw=$(sed -nE 's/^tokens\/word: ([0-9.]+)$/\1/p' "$tmp/out")
bpt=$(sed -nE 's/^bytes\/token: ([0-9.]+)$/\1/p' "$tmp/out")
# 141 learned pieces: several tokens a word, under 2.5 bytes a token.
awk -v t="$tpw" -v b="$bpt" 'BEGIN { exit !(t > 2 && t < 6 && b > 1 && b < 2.5) }' ||
  fail "tokens/word '$tpw', bytes/token '$bpt'"

# expect_error NAME PATTERN -- ARGS: exit 2, one stderr line containing PATTERN.
expect_error() {
  local name=$1 pattern=$2
  shift 3
  "$jumbo" "$@" >"$tmp/out" 2>"$tmp/err"
  local status=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [[ $status -eq 2 && $lines -eq 1 ]] && grep -qF -- "$pattern" "$tmp/err"; then
    echo "ok   $name: $(cat "$tmp/err")"
  else
    fail "$name: status $status, $lines stderr lines: $(cat "$tmp/err")"
  fi
}
expect_error missing-model "$tmp/none.model" -- data inspect-tokenizer "$tmp/none.model"
expect_error unreadable-sample "$tmp/none.jsonl: cannot open" -- \
  data inspect-tokenizer "$tmp/tok.model" --sample "$tmp/none.jsonl"
expect_error piece-length "--max-piece-length 65: expected 1 .. 64" -- \
  data tokenizer -i "$valid" -o "$tmp/x" --max-piece-length 65
expect_error sample-bytes "--sample-bytes 10: expected" -- \
  data tokenizer -i "$valid" -o "$tmp/x" --sample-bytes 10
printf '{"text": "fine"}\n{"body": "elsewhere"}\n' >"$tmp/bad.jsonl"
expect_error missing-key "$tmp/bad.jsonl:2:" -- data tokenizer -i "$tmp/bad.jsonl" -o "$tmp/x"

finish
