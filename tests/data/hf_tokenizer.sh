#!/usr/bin/env bash
# tokenizer.json (byte-level BPE) in jumbo against Hugging Face's own implementation,
# tokenizers.js (@huggingface/tokenizers 0.2.0, run by node), token for token.
#
# hf_tokenizer_write.py (independent of jumbo) learns 3000 merges on Brown text plus
# multilingual lines and writes four tokenizer.json files: Llama 3's (its split regex +
# ByteLevel, ignore_merges, its special tokens after the BPE vocabulary, a few whole-word tokens
# no merge reaches), Qwen 2.5's (single-digit regex, its NFC normalizer: decomposed accents,
# the Angstrom sign and conjoining Hangul jamo are composed first), GPT-2's (ByteLevel with its own regex; <|endoftext|> in the vocabulary and added,
# <mask> with lstrip/rstrip) and GPT-2's with add_prefix_space. Both sides encode Brown, this
# repository's code, CJK, emoji, long numbers, runs of spaces and newlines, added tokens, and
# ten texts that are not valid UTF-8, with no special token added.
#
# Invalid UTF-8: jumbo encodes it as if each maximal invalid subsequence were U+FFFD (WHATWG);
# node reads the bytes with TextDecoder, which does the same, so both encode the same string.
# Round trip: jumbo's decode(encode(x)) == x for every valid document, and for the invalid ones
# equals Python's bytes.decode("utf-8", "replace") (the same U+FFFD policy); not checked where
# the tokenizer itself adds text (add_prefix_space) or drops it (<mask>'s lstrip/rstrip).
#
# Usage: hf_tokenizer.sh JUMBO REPO. Exit 77 (skipped) when node or the package is missing.
set -euo pipefail
jumbo=$1
repo=$2
pkg=${JUMBO_NPM_DIR:-$HOME/.cache/jumbo/npm}/node_modules/@huggingface/tokenizers
command -v node >/dev/null || { echo "SKIP: node not found (apt install nodejs)"; exit 77; }
[[ -f $pkg/dist/tokenizers.mjs ]] ||
  { echo "SKIP: $pkg not found (npm install --prefix ~/.cache/jumbo/npm @huggingface/tokenizers@0.2.0)"; exit 77; }
echo "node $(node --version), tokenizers.js $(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$pkg/package.json" | head -1)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$repo/tests/data/hf_tokenizer_write.py" "$repo" "$tmp"

names=(llama3 qwen2 gpt2 gpt2_prefix)
for t in "${names[@]}"; do
  "$jumbo" data tokenize -t "$tmp/$t/tokenizer.json" -i "$tmp/corpus.jsonl" --decode >"$tmp/$t.jumbo"
  for f in "$tmp"/invalid/*.txt; do
    "$jumbo" data tokenize -t "$tmp/$t/tokenizer.json" -i "$f" --decode >>"$tmp/$t.jumbo"
  done
  node "$repo/tests/data/hf_tokenizer_encode.mjs" "$pkg" "$tmp/$t" "$tmp/corpus.jsonl" \
    "$tmp"/invalid/*.txt >"$tmp/$t.node"
done

python3 - "$tmp" "${names[@]}" <<'EOF'
import glob, json, sys, unicodedata
tmp, names = sys.argv[1], sys.argv[2:]
docs = [json.loads(l)["text"] for l in open(f"{tmp}/corpus.jsonl", encoding="utf-8") if l.strip()]
raw = [open(f, "rb").read() for f in sorted(glob.glob(f"{tmp}/invalid/*.txt"))]
want_text = docs + [b.decode("utf-8", "replace") for b in raw]
failed = False
normalized_docs = 0
for t in names:
    j = [json.loads(l) for l in open(f"{tmp}/{t}.jumbo", encoding="utf-8")]
    n = [json.loads(l) for l in open(f"{tmp}/{t}.node", encoding="utf-8")]
    assert len(j) == len(n) == len(want_text), (t, len(j), len(n), len(want_text))
    vocab = json.load(open(f"{tmp}/{t}/tokenizer.json", encoding="utf-8"))
    pieces = {i: s for s, i in vocab["model"]["vocab"].items()}
    pieces.update({a["id"]: a["content"] for a in vocab["added_tokens"]})
    tokens = differ = 0
    for k, (a, b) in enumerate(zip(j, n)):
        tokens += len(b["ids"])
        where = f"document {k}" if k < len(docs) else f"invalid text {k - len(docs)}: {raw[k - len(docs)]!r}"
        if a["ids"] != b["ids"]:
            differ += 1
            at = next((i for i, (x, y) in enumerate(zip(a["ids"], b["ids"])) if x != y),
                      min(len(a["ids"]), len(b["ids"])))
            show = lambda ids: [pieces.get(i, i) for i in ids[max(0, at - 3):at + 4]]
            print(f"{t}: {where}: jumbo and tokenizers.js differ at token {at} of "
                  f"{len(a['ids'])}/{len(b['ids'])}: jumbo {show(a['ids'])}, tokenizers.js {show(b['ids'])}")
        # Round trip, where the tokenizer neither adds text (add_prefix_space) nor drops it
        # (<mask>'s lstrip/rstrip take the spaces around it); Qwen's NFC normalizer composes
        # (Python's unicodedata, a third implementation of NFC).
        exact = t != "gpt2_prefix" and not (t == "gpt2" and "<mask>" in want_text[k])
        want = unicodedata.normalize("NFC", want_text[k]) if t == "qwen2" else want_text[k]
        if t == "qwen2" and want != want_text[k]:
            normalized_docs += 1
        if exact and a["text"] != want:
            differ += 1
            print(f"{t}: {where}: decode(encode(x)) != x: {a['text'][:80]!r} vs {want_text[k][:80]!r}")
    print(f"{t}: {len(j)} texts, {tokens} tokens, {differ} differences")
    failed |= differ > 0
# The cases must really be exercised: ignore_merges emitted a whole-word token, added tokens
# became their ids, and the invalid texts held U+FFFD.
llama = [json.loads(l)["ids"] for l in open(f"{tmp}/llama3.jumbo", encoding="utf-8")]
lv = json.load(open(f"{tmp}/llama3/tokenizer.json", encoding="utf-8"))
jumbo_word = lv["model"]["vocab"]["Ġjumbo"]
eot = next(a["id"] for a in lv["added_tokens"] if a["content"] == "<|eot_id|>")
assert any(jumbo_word in ids for ids in llama), "ignore_merges never emitted Ġjumbo"
assert any(eot in ids for ids in llama), "<|eot_id|> never encoded as its id"
assert all("\ufffd" in want_text[len(docs) + i] for i in range(len(raw)))
assert normalized_docs > 0, "no text NFC changed: the normalizer went untested"
sys.exit(1 if failed else 0)
EOF

# Refusals: one line naming the file, the field and the value; exit code 2.
expect_refusal() {  # expect_refusal NAME JSON_EDIT EXPECTED_LINE
  python3 - "$tmp/qwen2/tokenizer.json" "$tmp/$1/tokenizer.json" "$2" <<'EOF'
import json, os, sys
src, dst, edit = sys.argv[1:]
j = json.load(open(src, encoding="utf-8"))
exec(edit)
os.makedirs(os.path.dirname(dst), exist_ok=True)
json.dump(j, open(dst, "w", encoding="utf-8"), ensure_ascii=False)
EOF
  set +e
  out=$("$jumbo" data tokenize -t "$tmp/$1/tokenizer.json" -i "$tmp/corpus.jsonl" 2>&1)
  rc=$?
  set -e
  if [[ $rc -ne 2 || $out != *"$3"* || $(wc -l <<<"$out") -ne 1 ]]; then
    echo "$1: expected exit 2 and one line holding: $3"
    echo "got exit $rc: $out"
    exit 1
  fi
  echo "$1 refused: $out"
}
expect_refusal nfkc 'j["normalizer"] = {"type": "NFKC"}' \
  "$tmp/nfkc/tokenizer.json: normalizer = {\"type\":\"NFKC\"}: the only normalizer is {\"type\": \"NFC\"} (or null)"
expect_refusal wordpiece 'j["model"]["type"] = "WordPiece"' \
  "$tmp/wordpiece/tokenizer.json: model.type = \"WordPiece\": jumbo reads byte-level BPE"
expect_refusal merge 'j["model"]["merges"][7] = "Ġ no_such_token"' \
  "$tmp/merge/tokenizer.json: model.merges[7] = \"Ġ no_such_token\": \"no_such_token\" is not in model.vocab"
echo "hf_tokenizer: jumbo and tokenizers.js agree"
