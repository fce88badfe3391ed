#pragma once
// The text of one completion as its tokens arrive: the exact continuation of the prompt's
// text, decode(prompt + completion) minus decode(prompt). SentencePiece pieces do not decode
// one by one ("▁" is a space only inside text, and a document's first "▁" is dropped), so the
// completion is decoded whole each time after the prompt's last tokens. It is cut at the first
// stop string; a stream may send what can no longer change: held back while the end could
// still become a stop string or is an incomplete UTF-8 character. Each token owns the bytes it
// settled, so the tokens' texts join to the text (OpenAI's logprobs.tokens).
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/data/tokenizer.h"

namespace jumbo {

// A prompt's tokens as the model saw documents in training: the tokenizer's prompt prefix
// (Tokenizer::prompt_prefix: for SentencePiece the EOS that ends the document before, since
// `jumbo data prepare` ends every document with EOS; for a tokenizer.json its document start,
// as transformers encodes), once, then the text's tokens. `prefix_tokens`: how many were put
// before the text (0 when the text wrote them: a chat template's bos_token).
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& text,
                                   size_t* prefix_tokens = nullptr);

// Bytes at the end of `s` that may still change as tokens arrive: U+FFFD that SentencePiece
// made of a character's first byte pieces, or a raw partial character.
size_t unfinished_tail(const std::string& s);

// Each token's text, joining to tokenizer.decode(tokens): a token whose bytes do not end a
// character has "" and the token that completes it has the whole character.
std::vector<std::string> token_texts(const Tokenizer& tokenizer, const std::vector<int32_t>& tokens);

class CompletionText {
 public:
  // `prompt`: the tokens the completion continues (its last few are kept as context).
  CompletionText(const Tokenizer& tokenizer, std::vector<std::string> stops,
                 const std::vector<int32_t>& prompt);
  // Adds a generated token; true when the text now holds a stop string (the text is cut
  // before it, and later tokens are not added).
  bool add(int32_t token);
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The bytes [token_begin(i), token_end(i)) of text() are token i's; with `finished` the
  // last token's end is the text's end (its unsettled tail included).
  size_t token_begin(size_t i) const { return i == 0 ? 0 : token_end(i - 1, false); }
  size_t token_end(size_t i, bool finished) const;
  // The text not yet taken that is final; with `finished` (no more tokens) all of it.
  std::string take_delta(bool finished);
  size_t sent() const { return sent_; }

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> stops_;
  std::vector<int32_t> context_;  // the prompt's last tokens, then the completion's
  std::string context_text_;      // decode of the prompt's last tokens alone
  std::vector<int32_t> tokens_;
  std::vector<size_t> settled_;   // per token: bytes of text that no later token changes
  std::string text_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

}  // namespace jumbo
