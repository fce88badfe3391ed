#!/usr/bin/env python3
"""Makes the shipped multiple-choice task inputs/tasks/brown-lastword.jsonl: last-word
prediction of held-out paragraphs (in the manner of LAMBADA), from the Brown validation
split (inputs/data/brown-valid.jsonl), which no jumbo run trains on.

For each paragraph of at least --min-words words whose last word is alphabetic and at least
--min-letters letters long: the context is the paragraph up to that word (the last --max-chars
characters, cut at a word boundary), the right continuation is " " + the word, and the
distractors are --choices - 1 other paragraphs' last words (distinct, seeded). The answer's
place among the continuations is seeded too. Usage:
  python3 scripts/make-cloze-task.py [--seed 1] [--items 400] > inputs/tasks/brown-lastword.jsonl
"""
import argparse
import json
import random
import re

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--input", default="inputs/data/brown-valid.jsonl")
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--items", type=int, default=400)
parser.add_argument("--choices", type=int, default=4)
parser.add_argument("--min-words", type=int, default=12)
parser.add_argument("--min-letters", type=int, default=4)
parser.add_argument("--max-chars", type=int, default=400)
args = parser.parse_args()

candidates = []  # (context, word)
with open(args.input, encoding="utf-8") as f:
    for line in f:
        for paragraph in json.loads(line)["text"].split("\n"):
            words = paragraph.split()
            if len(words) < args.min_words:
                continue
            last = re.sub(r"[^A-Za-z]+$", "", words[-1])
            if len(last) < args.min_letters or not last.isalpha():
                continue
            context = " ".join(words[:-1])
            if len(context) > args.max_chars:
                context = context[-args.max_chars:]
                context = context[context.find(" ") + 1:]
            candidates.append((context, last))

rng = random.Random(args.seed)
rng.shuffle(candidates)
words = sorted({w for _, w in candidates})
for context, word in candidates[: args.items]:
    distractors = set()
    while len(distractors) < args.choices - 1:
        w = rng.choice(words)
        if w.lower() != word.lower():
            distractors.add(w)
    continuations = [" " + w for w in sorted(distractors)]
    answer = rng.randrange(args.choices)
    continuations.insert(answer, " " + word)
    print(json.dumps({"context": context, "continuations": continuations, "answer": answer}))
