#include "jumbo/infer/completion_text.h"

#include <algorithm>

namespace jumbo {
namespace {

// Prompt tokens kept as the completion's left context: enough for a space mark and for the
// byte pieces of a character cut at the prompt's end (at most 4).
constexpr size_t kContextTokens = 8;

size_t common_prefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

size_t unfinished_tail(const std::string& s) {
  static const std::string replacement = "\xEF\xBF\xBD";
  size_t held = 0;
  while (s.size() - held >= replacement.size() &&
         s.compare(s.size() - held - replacement.size(), replacement.size(), replacement) == 0) {
    held += replacement.size();
  }
  if (held > 0) return held;
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& text,
                                   size_t* prefix_tokens) {
  std::vector<int32_t> ids =
      with_prefix_once(tokenizer.encode(text), tokenizer.prompt_prefix(), prefix_tokens);
  if (ids.empty()) {  // an empty text and no prefix (Qwen 2.5): it starts after an EOS
    ids.push_back(tokenizer.eos_id());
    if (prefix_tokens) *prefix_tokens = 1;
  }
  return ids;
}

std::vector<std::string> token_texts(const Tokenizer& tokenizer,
                                     const std::vector<int32_t>& tokens) {
  std::vector<std::string> out;
  std::vector<int32_t> prefix;
  std::string text;
  size_t settled = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    prefix.push_back(tokens[i]);
    text = tokenizer.decode(prefix);
    const size_t end = i + 1 == tokens.size() ? text.size() : text.size() - unfinished_tail(text);
    out.push_back(end > settled ? text.substr(settled, end - settled) : std::string());
    settled = std::max(settled, end);
  }
  return out;
}

CompletionText::CompletionText(const Tokenizer& tokenizer, std::vector<std::string> stops,
                               const std::vector<int32_t>& prompt)
    : tokenizer_(tokenizer), stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  const size_t keep = std::min(prompt.size(), kContextTokens);
  context_.assign(prompt.end() - static_cast<std::ptrdiff_t>(keep), prompt.end());
  context_text_ = tokenizer_.decode(context_);
}

bool CompletionText::add(int32_t token) {
  if (stopped_) return true;
  tokens_.push_back(token);
  context_.push_back(token);
  const std::string whole = tokenizer_.decode(context_);
  // The context's own text is a prefix of the whole unless its last character was cut in
  // bytes that the completion finishes: then the completion starts where they agree.
  text_ = whole.substr(std::min(common_prefix(whole, context_text_), context_text_.size()));
  // A later token's settled bytes never lie before an earlier one's.
  settled_.push_back(std::max(settled_.empty() ? 0 : settled_.back(),
                              text_.size() - unfinished_tail(text_)));
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, text_.find(s));
  if (cut != std::string::npos) {
    text_.resize(cut);
    stopped_ = true;
  }
  return stopped_;
}

size_t CompletionText::token_end(size_t i, bool finished) const {
  if ((finished || stopped_) && i + 1 == tokens_.size()) return text_.size();
  return std::min(settled_[i], text_.size());
}

std::string CompletionText::take_delta(bool finished) {
  size_t end = text_.size();
  if (!finished && !stopped_) {
    // Hold back a tail that is a prefix of some stop string, and a partial character.
    size_t hold = unfinished_tail(text_);
    for (const std::string& s : stops_) {
      for (size_t k = std::min(s.size() - 1, text_.size()); k > hold; --k) {
        if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    end = text_.size() - hold;
  }
  if (end <= sent_) return "";
  std::string delta = text_.substr(sent_, end - sent_);
  sent_ = end;
  return delta;
}

}  // namespace jumbo
