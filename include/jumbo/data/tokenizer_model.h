#pragma once
// The model behind jumbo::Tokenizer: a SentencePiece .model (tokenizer_sentencepiece.cpp) or a
// Hugging Face tokenizer.json with a byte-level BPE model (tokenizer_bpe.cpp, parsed by
// tokenizer_json.cpp). Tokenizer is the one facade the rest of jumbo uses; this interface is
// what each kind implements. Every method is const and safe to call from several threads.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jumbo {

enum class TokenizerKind { sentencepiece, hf_byte_level_bpe };

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  virtual TokenizerKind kind() const = 0;
  // Max id + 1 (a tokenizer.json may leave ids unused: their piece is "").
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when none
  // The special tokens a document starts with: those a tokenizer.json's post_processor
  // (TemplateProcessing's "single") puts before a text, as transformers' tokenizer(text) adds
  // them (Llama 3: <|begin_of_text|>); none for SentencePiece (jumbo separates documents by
  // EOS alone).
  virtual std::vector<int32_t> document_start() const = 0;
  // The id of a token given by its stored text (a piece, or an added token's content).
  virtual std::optional<int32_t> token_id(std::string_view text) const = 0;
  // No BOS or other special token is ever added.
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual std::string piece(int32_t id) const = 0;
  virtual bool is_learned(int32_t id) const = 0;
  // The bytes the token contributes to a decoded text (may be part of a UTF-8 character).
  virtual std::string token_bytes(int32_t id) const = 0;
};

// `bytes`: the whole file. Both throw UserError naming `path` (and for tokenizer.json the
// field and value) on anything they do not support.
std::unique_ptr<TokenizerModel> load_sentencepiece_model(const std::string& path,
                                                         const std::string& bytes);
std::unique_ptr<TokenizerModel> load_tokenizer_json(const std::string& path,
                                                    const std::string& bytes);

// Whether a tokenizer file's bytes are a tokenizer.json: the first non-space byte is '{'.
bool looks_like_tokenizer_json(std::string_view bytes);

}  // namespace jumbo
