#pragma once
// SentencePiece tokenizer: training from text and encoding. EOS separates documents.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace jumbo {

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;   // .jsonl (one document per line, key "text") or text files
  std::string model_prefix;          // writes PREFIX.model and PREFIX.vocab
  int vocab_size = 8000;
  std::string model_type = "unigram";
  bool split_by_whitespace = false;  // false: multi-word pieces ("▁of▁the"), as J1's vocabulary
  bool byte_fallback = true;         // no unknown tokens
  int64_t input_sentence_size = 200000;  // sentences sampled for training
  int threads = 0;                   // 0 = all cores
  uint64_t seed = 1234;
};

// Trains and writes PREFIX.model / PREFIX.vocab. Throws UserError naming the input on bad input.
void train_tokenizer(const TokenizerTrainOptions& opts);

class Tokenizer {
 public:
  // Throws UserError naming the file if it is missing or not a SentencePiece model.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  int64_t vocab_size() const;
  int32_t eos_id() const;
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  // FNV-1a 64 of the model file's bytes: stored in a dataset's header, so a dataset is only
  // used with the tokenizer that made it.
  uint64_t fingerprint() const { return fingerprint_; }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  uint64_t fingerprint_ = 0;
  std::string path_;
};

}  // namespace jumbo
