#pragma once
// Byte-level BPE as a Hugging Face tokenizer.json describes it (GPT-2, Llama 3, Qwen 2.5):
// added tokens split out first, then a pre-tokenizer of regex splits and ByteLevel's byte ->
// character alphabet, then merges by rank. tokenizer_json.cpp reads the file into a BpeSpec
// (refusing what is not supported); ByteLevelBpe encodes and decodes.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "jumbo/data/tokenizer_model.h"

namespace jumbo {

// GPT-2's pre-tokenizer regex, which ByteLevel applies when its use_regex is true.
inline constexpr const char* kGpt2SplitRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedTokenSpec {
  int32_t id = 0;
  std::string content;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

struct BpeSpec {
  std::string path;                                        // for messages
  std::unordered_map<std::string, int32_t> vocab;          // model.vocab
  std::vector<std::pair<std::string, std::string>> merges;  // model.merges, rank = index
  bool ignore_merges = false;
  // The pre-tokenizer: each regex splits every piece (Split, behavior Isolated: matches and the
  // text between them become pieces), in order; then ByteLevel (add_prefix_space puts a space
  // before each piece that does not start with one, then its regex when use_regex).
  std::vector<std::string> split_regexes;
  std::vector<bool> split_literal;  // per split_regexes: a {"String": ...} pattern
  bool add_prefix_space = false;
  bool byte_level_regex = false;  // ByteLevel's use_regex: GPT-2's regex (kGpt2SplitRegex)
  bool nfc = false;               // normalizer NFC: text between unnormalized added tokens
  std::vector<AddedTokenSpec> added;
  std::string post_processor;  // its "type" ("" when null): recorded, never applied by encode
  std::vector<int32_t> document_start;  // its TemplateProcessing's special tokens before $A
  int32_t eos_id = -1, bos_id = -1;
};

class ByteLevelBpe final : public TokenizerModel {
 public:
  // Throws UserError naming spec.path, the field and the value (a merge naming a token
  // outside the vocabulary, a regex PCRE2 refuses, ...).
  explicit ByteLevelBpe(BpeSpec spec);
  ~ByteLevelBpe() override;

  TokenizerKind kind() const override { return TokenizerKind::hf_byte_level_bpe; }
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  int32_t eos_id() const override { return eos_id_; }
  int32_t bos_id() const override { return bos_id_; }
  std::vector<int32_t> document_start() const override { return document_start_; }
  std::optional<int32_t> token_id(std::string_view text) const override;
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string piece(int32_t id) const override;
  bool is_learned(int32_t id) const override;
  std::string token_bytes(int32_t id) const override;
  const std::string& post_processor() const { return post_processor_; }

  struct Regex;  // a compiled PCRE2 pattern (tokenizer_bpe.cpp)

 private:
  struct AddedMatcher;
  enum Kind : uint8_t { kUnused, kVocab, kAdded };

  void encode_section(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  std::string path_;
  std::vector<std::string> pieces_;       // by id: the stored token text, "" when unused
  std::vector<std::string> bytes_;        // by id: what the token decodes to
  std::vector<Kind> kinds_;               // by id
  std::unordered_map<std::string, int32_t> vocab_;  // model.vocab
  std::unordered_map<std::string, int32_t> added_ids_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left, right) -> rank, id
  int32_t byte_ids_[256] = {};            // the id of each byte's alphabet character
  std::string byte_chars_[256];           // each byte's alphabet character, UTF-8
  bool ignore_merges_ = false, add_prefix_space_ = false, nfc_ = false;
  std::vector<std::unique_ptr<Regex>> splits_;
  std::unique_ptr<Regex> byte_level_regex_;  // GPT-2's, when ByteLevel's use_regex
  std::unique_ptr<Regex> space_, word_;      // \s and \w, for added tokens' strip and single_word
  std::unique_ptr<AddedMatcher> unnormalized_, normalized_;
  std::string post_processor_;
  std::vector<int32_t> document_start_;
  int32_t eos_id_ = -1, bos_id_ = -1;
  uint64_t serial_ = 0;  // tells this tokenizer's per-thread word cache from another's
};

}  // namespace jumbo
