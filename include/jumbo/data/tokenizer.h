#pragma once
// Tokenizers: SentencePiece training from a bounded, seeded sample of the input text; the
// Tokenizer facade over a SentencePiece .model or a Hugging Face byte-level BPE tokenizer.json
// (tokenizer_model.h); inspection of a vocabulary. EOS separates documents.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jumbo/data/tokenizer_model.h"

namespace jumbo {

// The trainer skips longer sentences, so the sampler never spends budget on them. Brown
// paragraphs reach ~10 KB.
inline constexpr int64_t kMaxSentenceBytes = 16384;

// Measured: SentencePiece's unigram trainer peaks at ~25-30 bytes of memory per sampled byte
// of English (its suffix array), so this default needs ~7 GiB and fits a 16 GB machine; a
// 256K vocabulary needed about this much text (192 MiB of Brown-derived text with 10M seed
// pieces; 128 MiB with the default 1M held only 174K pieces).
inline constexpr int64_t kDefaultSampleBytes = int64_t{256} << 20;

// Each field names the `jumbo data tokenizer` flag it comes from; check_tokenizer_options
// names the flag when a value is out of range.
struct TokenizerTrainOptions {
  std::vector<std::string> inputs;     // --input: .jsonl (key "text") or text files
  std::string model_prefix;            // --output: writes PREFIX.model and PREFIX.vocab
  int vocab_size = 8000;               // --vocab-size
  std::string model_type = "unigram";  // --model-type: unigram, bpe, char or word
  bool split_by_whitespace = false;  // false: multi-word pieces ("▁of▁the"), as J1's vocabulary
  bool byte_fallback = true;         // no unknown tokens
  // --sample-bytes: training text kept from all inputs (a uniform sample of sentences).
  int64_t sample_bytes = kDefaultSampleBytes;
  // --input-sentence-size: at most this many sentences in the sample; 0 = no limit (the
  // byte budget decides).
  int64_t input_sentence_size = 0;
  int max_piece_length = 16;      // --max-piece-length: characters, 1 .. 64
  int64_t seed_pieces = 1000000;  // --seed-pieces: unigram candidates before pruning
  int threads = 0;                // --threads: trainer threads, 0 = all cores (at most 128)
  uint64_t seed = 1234;           // --seed: the sample and the trainer's generator
  bool verbose = false;           // --verbose: SentencePiece's progress log on stderr
};

// What the sampler read and kept.
struct SampleStats {
  int64_t files = 0;
  int64_t bytes_read = 0;        // file bytes, all inputs
  int64_t lines_read = 0;        // lines of all inputs (JSON lines or text lines)
  int64_t lines_not_parsed = 0;  // JSON lines none of whose paragraphs could enter the sample
  int64_t sentences_seen = 0;    // sentences (non-empty paragraphs) of the parsed lines
  int64_t too_long = 0;          // sentences over kMaxSentenceBytes, never sampled
  int64_t sampled_sentences = 0;
  int64_t sampled_bytes = 0;
  std::vector<int64_t> sampled_per_input;  // sentences kept from each input, in input order
  double seconds = 0;
};

struct SentenceSample {
  std::vector<std::string> sentences;  // in key order: a seeded shuffle
  SampleStats stats;
};

// Throws UserError, one line naming the flag, the value and what is expected. Called by
// train_tokenizer before any input is read.
void check_tokenizer_options(const TokenizerTrainOptions& opts);

// Streams every input once and keeps the smallest-key sentences that fit both
// opts.sample_bytes and opts.input_sentence_size. A sentence is a non-empty line of a
// document; its key is a hash of (seed, input index, line, paragraph within the line), so the
// sample is uniform over all inputs and the same for any thread count. Once the sample is
// full, a JSON line none of whose paragraphs could enter is not parsed (only checked to look
// like an object). Memory: the budget plus ~64 bytes a sentence. Throws UserError naming file
// and line on unreadable input, bad JSON or a missing key.
SentenceSample sample_training_sentences(const TokenizerTrainOptions& opts);

// Trains on a sample (consumed: each sentence is freed as the trainer copies it) and writes
// PREFIX.model / PREFIX.vocab. Returns the training seconds.
double train_tokenizer_on(SentenceSample&& sample, const TokenizerTrainOptions& opts);

struct TokenizerTrainReport {
  SampleStats sample;
  double train_seconds = 0;
};

// check_tokenizer_options, sample_training_sentences, train_tokenizer_on.
TokenizerTrainReport train_tokenizer(const TokenizerTrainOptions& opts);

// Calls fn(document, line) for each document of an input, streamed: a .jsonl line's value
// under json_key (line from 1), or a whole text file (line 0). Throws UserError naming file
// and line.
void for_each_input_document(const std::string& path, const std::string& json_key,
                             const std::function<void(const std::string&, int64_t)>& fn);

// A SentencePiece .model, or a Hugging Face tokenizer.json (a file whose first non-space byte
// is '{'; byte-level BPE only: GPT-2, Llama 3, Qwen 2.5 without its NFC normalizer; see
// docs/data-format.md). encode never adds BOS or any other special token (a tokenizer.json's
// post_processor is recorded, not applied); text that is not valid UTF-8 is encoded by a
// tokenizer.json as if each maximal invalid subsequence were U+FFFD (WHATWG).
class Tokenizer {
 public:
  // Throws UserError naming the file if it is missing, not a SentencePiece model, or a
  // tokenizer.json with anything jumbo does not support (naming the field and value).
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  TokenizerKind kind() const;
  // Max id + 1.
  int64_t vocab_size() const;
  int32_t eos_id() const;
  // -1 when none (SentencePiece: its <s> piece; tokenizer.json: tokenizer_config.json's
  // bos_token). encode never adds it.
  int32_t bos_id() const;
  // The special tokens that start a document (TokenizerModel::document_start: Llama 3's
  // <|begin_of_text|>; none for SentencePiece, Qwen 2.5, GPT-2). `data prepare` starts every
  // document with them, once.
  std::vector<int32_t> document_start() const;
  // What a prompt (a text the model continues, as a document starts) begins with: the document
  // start of a tokenizer.json (what transformers' tokenizer(text) adds), or for SentencePiece
  // the EOS that ends the document before it in jumbo's data.
  std::vector<int32_t> prompt_prefix() const;
  // The id of the token stored as `text` (a piece, or an added token's content).
  std::optional<int32_t> token_id(std::string_view text) const;
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  // The piece as stored ("▁of▁the", "Ġthe", "<|eot_id|>"), and whether it was learned from
  // text (not a control, unknown, byte or unused piece; not a tokenizer.json added token).
  std::string piece(int32_t id) const;
  bool is_learned(int32_t id) const;
  // The bytes the token contributes to a decoded text: "▁" as a space, a byte piece its byte,
  // a byte-level BPE token its bytes (perhaps part of a UTF-8 character), an added token its
  // content; SentencePiece's control and unknown pieces nothing.
  std::string token_bytes(int32_t id) const;
  // FNV-1a 64 of the model file's bytes: stored in a dataset's header, so a dataset is only
  // used with the tokenizer that made it.
  uint64_t fingerprint() const { return fingerprint_; }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<TokenizerModel> model_;
  uint64_t fingerprint_ = 0;
  std::string path_;
};

// `tokens` with `prefix` in front, unless they already begin with it (a text that wrote its own
// document start, as a chat template's bos_token does). `added`: how many tokens were put.
std::vector<int32_t> with_prefix_once(std::vector<int32_t> tokens,
                                      const std::vector<int32_t>& prefix, size_t* added = nullptr);

// `text` as it is tokenized after a piece boundary inside a document (a completion after its prompt, a task's continuation after
// its context): SentencePiece's pieces
// of its characters alone, without the word-start mark `encode` puts before a text (so
// " press" is "▁press", and "ing" has no "▁"). decode(prefix + these) == decode(prefix) + text
// for a non-empty prefix. Throws UserError if the tokenizer has no character to force the
// boundary with (none of "\n", U+0001, U+E000 outside its vocabulary). A tokenizer.json puts
// no mark before a text: this is encode(text).
std::vector<int32_t> encode_after_boundary(const Tokenizer& tokenizer, const std::string& text);

// `jumbo data inspect-tokenizer`. A multi-word piece holds "▁" (a word boundary) after its
// first character: "▁of▁the", "s▁of".
struct LongPiece {
  std::string piece;
  int64_t chars = 0;  // Unicode characters, "▁" counted as one
};
struct TokenizerInspection {
  int64_t vocab_size = 0;
  int64_t learned = 0;  // pieces learned from text
  int64_t byte_pieces = 0;
  int64_t multi_word = 0;          // learned pieces spanning a word boundary
  std::vector<LongPiece> longest;  // longest learned pieces, longest first
  // Over the sample file, when one is given (each document encoded whole, as prepare does).
  std::string sample;
  int64_t sample_documents = 0, sample_words = 0, sample_tokens = 0, sample_bytes = 0;
};
TokenizerInspection inspect_tokenizer(const std::string& model_path, const std::string& sample,
                                      int top_pieces);
int64_t utf8_chars(const std::string& s);

}  // namespace jumbo
