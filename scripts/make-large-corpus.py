#!/usr/bin/env python3
"""Make a large English corpus from the shipped Brown text, for tokenizer and data tests at scale.

    scripts/make-large-corpus.py --mb 300 --files 8 --seed 1 --out /tmp/corpus

Writes DIR/corpus-00.jsonl .. corpus-NN.jsonl, one {"id", "text"} object per line as
inputs/data/brown-train.jsonl, together about --mb MiB (each file its share, to one document).

How text is made (a "splice walk" over Brown's words): a paragraph starts at the start of a
random Brown paragraph and copies Brown's words one at a time; after each word, with
probability --jump, it jumps to a random other occurrence of that same word in Brown and
continues copying from there. The paragraph ends where the copy reaches a Brown paragraph end.
So every adjacent word pair is one Brown has, copied runs average 1/--jump words, and nearly
every paragraph is a new string, while word and phrase frequencies stay Brown's: a corpus far
larger than Brown without exact duplicates a tokenizer would memorise. A document has as many
paragraphs as a randomly drawn Brown document. The output depends only on --seed, --mb,
--files, --jump and the Brown file (each file is made from its own generator, so --jobs does
not change it). Standard library only.
"""
import argparse
import json
import multiprocessing
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BROWN = os.path.join(HERE, "..", "inputs", "data", "brown-train.jsonl")
PARAGRAPH_END = "\n"  # a token of its own in the word stream
MAX_WORDS = 1500      # ~9 KB: keeps paragraphs under the tokenizer's 16 KB sentence limit


class Brown:
    """Brown's words as one stream with paragraph ends, and where each word occurs."""

    def __init__(self, path):
        self.words = []
        self.paragraph_starts = []
        self.doc_paragraphs = []
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (ValueError, KeyError, TypeError) as e:
                    sys.exit(f"{path}:{line_no}: expected a JSON object with a string \"text\" ({e})")
                paragraphs = [p.split() for p in text.split("\n")]
                paragraphs = [p for p in paragraphs if p]
                self.doc_paragraphs.append(len(paragraphs))
                for p in paragraphs:
                    self.paragraph_starts.append(len(self.words))
                    self.words.extend(p)
                    self.words.append(PARAGRAPH_END)
        if not self.words:
            sys.exit(f"{path}: holds no text")
        self.occurrences = {}
        for i, w in enumerate(self.words):
            if w != PARAGRAPH_END:
                self.occurrences.setdefault(w, []).append(i)


def paragraph(brown, rng, jump):
    words = brown.words
    occurrences = brown.occurrences
    at = rng.choice(brown.paragraph_starts)
    out = []
    while len(out) < MAX_WORDS:
        w = words[at]
        if w == PARAGRAPH_END:
            break
        out.append(w)
        if rng.random() < jump:
            at = rng.choice(occurrences[w])  # the same word elsewhere: the next pair is Brown's
        at = (at + 1) % len(words)
    return " ".join(out)


def make_file(task):
    brown_path, out_path, index, target_bytes, seed, jump = task
    brown = Brown(brown_path)
    rng = random.Random(f"make-large-corpus:{seed}:{index}")  # str seeds are stable (SHA-512)
    written = docs = paragraphs = 0
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        while written < target_bytes:
            n = rng.choice(brown.doc_paragraphs)
            text = "\n".join(paragraph(brown, rng, jump) for _ in range(n))
            line = json.dumps({"id": f"large{index:02d}-{docs:07d}", "text": text},
                              ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
            docs += 1
            paragraphs += n
    os.replace(tmp, out_path)  # no half-written file under the final name
    return out_path, written, docs, paragraphs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, required=True, help="total size in MiB")
    ap.add_argument("--files", type=int, default=8, help="number of .jsonl files (default 8)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--jump", type=float, default=0.25,
                    help="chance to jump to another occurrence after each word (default 0.25)")
    ap.add_argument("--jobs", type=int, default=1, help="files made in parallel (default 1)")
    ap.add_argument("--brown", default=DEFAULT_BROWN, help="source .jsonl (default: shipped Brown)")
    a = ap.parse_args()
    if a.mb <= 0:
        sys.exit(f"--mb {a.mb}: expected a size above 0 MiB")
    if a.files < 1 or a.files > 100:
        sys.exit(f"--files {a.files}: expected 1 .. 100")
    if not 0 < a.jump <= 1:
        sys.exit(f"--jump {a.jump}: expected a probability in (0, 1]")
    if a.jobs < 1:
        sys.exit(f"--jobs {a.jobs}: expected at least 1")
    if not os.path.isfile(a.brown):
        sys.exit(f"{a.brown}: cannot open (the Brown .jsonl)")
    os.makedirs(a.out, exist_ok=True)

    total = int(a.mb * (1 << 20))
    tasks = []
    for i in range(a.files):
        share = total // a.files + (1 if i < total % a.files else 0)
        tasks.append((a.brown, os.path.join(a.out, f"corpus-{i:02d}.jsonl"), i, share, a.seed, a.jump))
    t0 = time.time()
    if a.jobs == 1:
        results = [make_file(t) for t in tasks]
    else:
        with multiprocessing.Pool(min(a.jobs, a.files)) as pool:
            results = pool.map(make_file, tasks)
    size = sum(r[1] for r in results)
    docs = sum(r[2] for r in results)
    paras = sum(r[3] for r in results)
    print(f"wrote {len(results)} files, {size / (1 << 20):.1f} MiB, {docs} documents, "
          f"{paras} paragraphs to {a.out} in {time.time() - t0:.1f} s "
          f"(seed {a.seed}, jump {a.jump})")


if __name__ == "__main__":
    main()
