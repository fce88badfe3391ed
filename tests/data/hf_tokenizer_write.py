#!/usr/bin/env python3
"""Writes byte-level BPE tokenizer.json files for tests/data/hf_tokenizer.sh, and the texts to
encode. Independent of jumbo: the merges are learned here, by the classic BPE training loop, on
Brown text plus some multilingual lines, pre-tokenized with Python's `re` (an approximation of
the GPT-2/Llama 3 split; which merges exist does not matter for the comparison, only that the
files are realistic).

Usage: hf_tokenizer_write.py REPO OUT
Writes OUT/{llama3,qwen2,gpt2}/tokenizer.json + tokenizer_config.json, OUT/corpus.jsonl (valid
UTF-8 documents) and OUT/invalid/NN.txt (texts that are not valid UTF-8, one a file).
"""
import collections
import heapq
import json
import os
import re
import sys

repo, out = sys.argv[1], sys.argv[2]

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()

MULTILINGUAL = """日本語のテキストをトークン化します。東京は日本の首都です。
中文分词测试：我们今天去北京大学看看。人工智能正在改变世界。
한국어 문장도 포함합니다. 서울은 대한민국의 수도입니다.
Привет, мир! Это проверка токенизатора на русском языке.
Ελληνικά: καλημέρα κόσμε. Français : élève, garçon, déjà vu.
emoji 🙂🙂 👍🏽 👨‍👩‍👧 🇯🇵 and ✨ sparkles ✨
def tokenize(text):\n    return [t for t in text.split() if t]\n
for (int i = 0; i < 1000; ++i) { sum += values[i] * 2; }
"""


def training_words():
    counts = collections.Counter()
    pat = re.compile(r" ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s+")
    with open(os.path.join(repo, "inputs/data/brown-train.jsonl"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 120:
                break
            counts.update(pat.findall(json.loads(line)["text"]))
    for _ in range(40):
        counts.update(pat.findall(MULTILINGUAL))
    return {tuple(B2U[b] for b in w.encode("utf-8")): c for w, c in counts.items()}


def learn_merges(words, n_merges):
    """Classic BPE: repeatedly merge the most frequent pair (ties: the smallest pair). The
    counts live in a dict; a heap of (-count, pair) entries, stale ones skipped when popped,
    finds the best pair without scanning every pair each merge."""
    words = [[list(w), c] for w, c in words.items()]
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, (w, c) in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += c
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        neg, best = heapq.heappop(heap)
        if pairs.get(best, 0) != -neg:
            continue  # stale: the count changed since this entry was pushed
        if -neg < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        touched = set()
        for i in list(where[best]):
            w, c = words[i]
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] -= c
                where[(a, b)].discard(i)
                touched.add((a, b))
            new, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and (w[k], w[k + 1]) == best:
                    new.append(joined)
                    k += 2
                else:
                    new.append(w[k])
                    k += 1
            words[i][0] = new
            for a, b in zip(new, new[1:]):
                pairs[(a, b)] += c
                where[(a, b)].add(i)
                touched.add((a, b))
        for p in touched:
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], p))
            else:
                del pairs[p]
    return merges


def added(i, content, special=True, lstrip=False, rstrip=False, normalized=False):
    return {"id": i, "content": content, "single_word": False, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": normalized, "special": special}


def tokenizer_json(merges, pre_tokenizer, added_tokens, ignore_merges, merge_pairs, extra=(),
                   normalizer=None):
    vocab = {B2U[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for t in extra:  # whole words no merge reaches: only ignore_merges emits them
        vocab.setdefault(t, len(vocab))
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added_tokens(len(vocab)),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                  "vocab": vocab,
                  "merges": [[a, b] for a, b in merges] if merge_pairs
                  else [f"{a} {b}" for a, b in merges]},
    }


def split_then_byte_level(regex):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}


def llama3_added(v):
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
             "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    return [added(v + k, n) for k, n in enumerate(names)]


def qwen2_added(v):
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
             "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|fim_prefix|>"]
    tokens = [added(v + k, n) for k, n in enumerate(names)]
    tokens.append(added(v + len(names), "<tool_call>", special=False, normalized=True))
    return tokens


def gpt2_added(v):
    # <|endoftext|> is in the vocabulary too, as in GPT-2 (id 50256 both ways); <mask> takes the
    # spaces around it (RoBERTa's lstrip).
    return [added(v - 1, "<|endoftext|>"), added(v, "<mask>", lstrip=True, rstrip=True)]


def write(name, tok, config):
    os.makedirs(os.path.join(out, name), exist_ok=True)
    with open(os.path.join(out, name, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)
    with open(os.path.join(out, name, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)


merges = learn_merges(training_words(), 3000)
extra = ["Ġjumbo", "ĠTokenizers", "ĠĠĠĠĠĠĠĠ", "ĊĊĊ", "Ġ1234"]
write("llama3", tokenizer_json(merges, split_then_byte_level(LLAMA3_REGEX), llama3_added, True,
                               True, extra),
      {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
       "clean_up_tokenization_spaces": False})
write("qwen2", tokenizer_json(merges[:2000], split_then_byte_level(QWEN2_REGEX), qwen2_added,
                              False, False, normalizer={"type": "NFC"}),
      {"bos_token": None, "eos_token": "<|im_end|>", "clean_up_tokenization_spaces": False})
gpt2 = tokenizer_json(merges[:2500], {"type": "ByteLevel", "add_prefix_space": False,
                                      "trim_offsets": True, "use_regex": True},
                      gpt2_added, False, False, ["<|endoftext|>"])
write("gpt2", gpt2, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                     "clean_up_tokenization_spaces": False})
# GPT-2 with add_prefix_space, as RoBERTa's.
gpt2["pre_tokenizer"]["add_prefix_space"] = True
write("gpt2_prefix", gpt2, {"eos_token": "<|endoftext|>", "clean_up_tokenization_spaces": False})

# The texts: Brown validation documents, this repository's code, and the hard cases.
docs = []
with open(os.path.join(repo, "inputs/data/brown-valid.jsonl"), encoding="utf-8") as f:
    docs += [json.loads(line)["text"] for line in f]
for rel in ["src/data/tokenizer_bpe.cpp", "scripts/demo.sh", "tests/data/hf_tokenizer_write.py",
            "CMakeLists.txt"]:
    with open(os.path.join(repo, rel), encoding="utf-8") as f:
        docs.append(f.read())
docs += MULTILINGUAL.split("\n")
docs += [
    MULTILINGUAL,
    "Numbers: 1 12 123 1234 12345 123456 1234567 3.14159265358979 1,000,000 0x7fff 2024-06-01",
    "99999999999999999999999999999999 and ٣٤٥ and ½ ² Ⅻ",
    "spaces:  two   three    four     five\t\ttabs \n\n\n newlines\r\n\r\nCRLF   \n  \n",
    "    leading spaces and trailing spaces    ",
    "\n\n\nstarts with newlines",
    " ",
    "",
    "a",
    "DON'T I'LL You're it's we've THEY'D she'S",
    "emoji 🙂 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇩🇪🇫🇷 😀😃😄 ❤️",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhello<|im_end|>",
    "text<|endoftext|>more text <|endoftext|> spaced",
    "fill  <mask>  here and<mask>there <mask>",
    "<tool_call>{\"name\": \"f\"}</tool_call> <|eot_id|><|eot_id|>",
    "partial <|eot_id| and <|begin_of_text and <|im_end",
    "Not NFC: cafe\u0301 A\u030a \u212b \u1100\u1161\u11a8 n\u0303 o\u0308\u0304 <tool_call>e\u0301",
    "Mixed: naïve café résumé — “quotes” ‘single’ … ellipsis • bullet © ™",
    "हिन्दी पाठ और العربية نص و עברית",
    "jumbo Tokenizers jumbo, Tokenizers. 1234 1234567",
    "\u00a0non-breaking\u00a0spaces\u2003em space\u3000ideographic space",
    "x" * 3000,
    " " * 2000 + "end",
    "ab" * 1500,
]
with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")

invalid = [
    b"caf\xe9 latin-1",
    b"\xff\xfe\xfd bytes that never start a character",
    b"cut \xe2\x82 euro and cut emoji \xf0\x9f\x99 end",
    b"overlong \xc0\xaf and \xe0\x80\xaf",
    b"surrogate \xed\xa0\x80\xed\xb0\x80 pair",
    b"above U+10FFFF \xf4\x90\x80\x80",
    b"lone continuation \x80\x81\xbf bytes",
    b"trailing lead \xe6\x97",
    b"\xc3(mixed)\xa9 valid \xc3\xa9 \xe6\x97\xa5",
    b"<|eot_id|>\xff<|im_end|>\xfe<|endoftext|>",
]
os.makedirs(os.path.join(out, "invalid"), exist_ok=True)
for k, b in enumerate(invalid):
    with open(os.path.join(out, "invalid", f"{k:02d}.txt"), "wb") as f:
        f.write(b)
print(f"wrote 4 tokenizers ({len(merges)} merges learned), {len(docs)} documents, "
      f"{len(invalid)} invalid texts")
