#!/usr/bin/env python3
"""Makes the shipped Brown genre-classification data: fine-tuning examples from the training
split and a multiple-choice task from the validation split, which no jumbo run trains on.

  inputs/data/brown-genre-train.jsonl  {"prompt": ..., "completion": " NAME"} per line, for
                                       jumbo data prepare --format prompt-completion
  inputs/tasks/brown-genre.jsonl       {"context": ..., "continuations": [15 names],
                                       "answer": i} per line, for jumbo eval --task

Both from inputs/data/brown-{train,valid}.jsonl, whose document ids ca01 .. cr09 name the
Brown genre in their first two letters. A prompt is one paragraph of a document (paragraphs
are the "\\n"-separated lines of its text) of at least --min-words words, cut to at most
--max-chars characters at a word boundary, followed by "\\nGenre:"; the completion (or the
right continuation) is " " + the genre's name. With the demo's 4096-piece tokenizer a
prompt of 300 characters is ~80 pieces (median; the longest, dense with names and numbers,
~125), so prompt, name and EOS fit the demo model's 128-token context; at 350 characters
20 of the examples did not.

Which paragraphs: each document's qualifying paragraphs are shuffled (seeded) and the first
--per-doc kept; then each genre takes them round-robin over its documents (one from each
document in turn) until it has --per-genre, so that a genre of many documents (learned: 76)
is not over-represented and each genre's examples come from as many documents as possible.
Genres with fewer documents (science fiction: 6, humour: 8) end with fewer examples. The
same rule with --valid-per-doc and --valid-per-genre makes the task; the validation split
has no science-fiction document, so its items cover 14 of the 15 names (chance is still
1/15: every item offers all 15). Both files are shuffled (seeded) so that any head of them
mixes the genres. The same arguments give the same bytes.

The names: one or two words, Brown's own word for the genre where it has one distinctive
word, all 15 distinct, no name a prefix of another and no two sharing a first word (so
that, scored whole or by its first piece, each continuation points at one genre):
  ca reportage       press: reportage
  cb editorial       press: editorial
  cc reviews         press: reviews
  cd religion        religion
  ce hobbies         skills and hobbies ("skills" is less telling)
  cf lore            popular lore
  cg belles-lettres  belles lettres (hyphenated: one name, not the article "belles")
  ch government      miscellaneous: government & house organs ("miscellaneous" says nothing)
  cj learned         learned (Brown's name for scientific and scholarly writing)
  ck fiction         general fiction
  cl mystery         mystery and detective fiction
  cm science fiction science fiction (two words; "fiction" alone is ck)
  cn western         adventure and western fiction ("western" is the more specific word)
  cp romance         romance and love story
  cr humor           humor (Brown's American spelling)

Usage (from the repository root; the defaults write the shipped files):
  python3 scripts/make-genre-task.py [--seed 1] [--train-output F] [--task-output F]
"""
import argparse
import json
import random
import sys

GENRES = [  # (Brown id prefix, name); this order is the task's continuations' order
    ("ca", "reportage"),
    ("cb", "editorial"),
    ("cc", "reviews"),
    ("cd", "religion"),
    ("ce", "hobbies"),
    ("cf", "lore"),
    ("cg", "belles-lettres"),
    ("ch", "government"),
    ("cj", "learned"),
    ("ck", "fiction"),
    ("cl", "mystery"),
    ("cm", "science fiction"),
    ("cn", "western"),
    ("cp", "romance"),
    ("cr", "humor"),
]
SUFFIX = "\nGenre:"

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--train-input", default="inputs/data/brown-train.jsonl")
parser.add_argument("--valid-input", default="inputs/data/brown-valid.jsonl")
parser.add_argument("--train-output", default="inputs/data/brown-genre-train.jsonl")
parser.add_argument("--task-output", default="inputs/tasks/brown-genre.jsonl")
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--min-words", type=int, default=20)
parser.add_argument("--max-chars", type=int, default=300)
parser.add_argument("--per-doc", type=int, default=32)
parser.add_argument("--per-genre", type=int, default=200)
parser.add_argument("--valid-per-doc", type=int, default=10)
parser.add_argument("--valid-per-genre", type=int, default=20)
args = parser.parse_args()

names = dict(GENRES)
# Python's own checks of the rule in the docstring.
assert len(set(names.values())) == len(GENRES)
assert len({n.split()[0] for n in names.values()}) == len(GENRES)


def cut(paragraph):
    """The paragraph's words, joined by single spaces, to at most --max-chars characters."""
    text = " ".join(paragraph.split())
    if len(text) > args.max_chars:
        text = text[: args.max_chars + 1]
        text = text[: text.rfind(" ")]
    return text


def examples(path, per_doc, per_genre, rng):
    """(prompt, genre prefix) pairs of one split, in the round-robin order described above."""
    by_genre = {g: [] for g, _ in GENRES}  # genre -> one list of prompts per document
    with open(path, encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            genre = doc["id"][:2]
            paragraphs = [p for p in doc["text"].split("\n") if len(p.split()) >= args.min_words]
            rng.shuffle(paragraphs)
            by_genre[genre].append([cut(p) + SUFFIX for p in paragraphs[:per_doc]])
    out = []
    for genre, _ in GENRES:
        docs, taken = by_genre[genre], []
        for k in range(per_doc):
            for prompts in docs:
                if k < len(prompts) and len(taken) < per_genre:
                    taken.append(prompts[k])
        out += [(p, genre) for p in taken]
    rng.shuffle(out)
    return out


def write(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


rng = random.Random(args.seed)
train = examples(args.train_input, args.per_doc, args.per_genre, rng)
write(args.train_output, ({"prompt": p, "completion": " " + names[g]} for p, g in train))

order = [g for g, _ in GENRES]
continuations = [" " + n for _, n in GENRES]
task = examples(args.valid_input, args.valid_per_doc, args.valid_per_genre, rng)
write(args.task_output, ({"context": p, "continuations": continuations, "answer": order.index(g)}
                         for p, g in task))

# A count per genre on stderr, for inputs/data/README.md.
for label, rows in (("train", train), ("task", task)):
    counts = {g: 0 for g in order}
    for _, g in rows:
        counts[g] += 1
    print(f"{label}: {len(rows)} " + " ".join(f"{names[g].replace(' ', '_')}={counts[g]}"
                                            for g in order), file=sys.stderr)
