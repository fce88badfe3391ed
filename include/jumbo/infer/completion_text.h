#pragma once
// The text of one completion as its tokens arrive: decoded whole each time (SentencePiece
// pieces do not decode one by one: "▁" becomes a space only inside text), cut at the first
// stop string, and what a stream may send so far — held back while the end could still
// become a stop string or is an incomplete UTF-8 character.
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/data/tokenizer.h"

namespace jumbo {

// A prompt's tokens as the model saw documents in training: `jumbo data prepare` ends every
// document with EOS, so a text that starts a document follows an EOS.
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& text);

class CompletionText {
 public:
  CompletionText(const Tokenizer& tokenizer, std::vector<std::string> stops);
  // Adds a generated token; true when the text now holds a stop string (the text is cut
  // before it, and later tokens are not added).
  bool add(int32_t token);
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The text not yet taken that is final; with `finished` (no more tokens) all of it.
  std::string take_delta(bool finished);

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> stops_;
  std::vector<int32_t> tokens_;
  std::string text_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

}  // namespace jumbo
