// The reference side of tests/data/hf_tokenizer.sh: Hugging Face's tokenizers.js
// (@huggingface/tokenizers 0.2.0) encodes each document without special tokens added.
// Usage: node hf_tokenizer_encode.mjs PACKAGE_DIR TOKENIZER_DIR CORPUS.jsonl [RAW_FILE ...]
// Prints {"ids": [...]} a line: the corpus's documents, then each raw file, whose bytes are
// decoded as node's TextDecoder does (WHATWG: each maximal invalid UTF-8 subsequence becomes
// U+FFFD; a leading BOM is kept), since a JavaScript string cannot hold invalid UTF-8.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [pkg, dir, corpus, ...raw] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(path.join(pkg, "dist", "tokenizers.mjs")).href);
const read = (name) => JSON.parse(fs.readFileSync(path.join(dir, name), "utf8"));
const tokenizer = new Tokenizer(read("tokenizer.json"), read("tokenizer_config.json"));
const encode = (text) => tokenizer.encode(text, { add_special_tokens: false }).ids;
const lines = [];
for (const line of fs.readFileSync(corpus, "utf8").split("\n")) {
  if (line.trim() === "") continue;
  lines.push(JSON.stringify({ ids: encode(JSON.parse(line).text) }));
}
const decoder = new TextDecoder("utf-8", { ignoreBOM: true });
for (const file of raw) lines.push(JSON.stringify({ ids: encode(decoder.decode(fs.readFileSync(file))) }));
process.stdout.write(lines.join("\n") + "\n");
