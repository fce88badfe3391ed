#include "jumbo/infer/completion_text.h"

#include <algorithm>

namespace jumbo {
namespace {

// Bytes at the end of s that may still change: SentencePiece decodes the first bytes of a
// character whose byte pieces have not all arrived as U+FFFD (EF BF BD), and a raw partial
// character may end the text.
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

}  // namespace

std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> ids{tokenizer.eos_id()};
  const std::vector<int32_t> body = tokenizer.encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

CompletionText::CompletionText(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : tokenizer_(tokenizer), stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

bool CompletionText::add(int32_t token) {
  if (stopped_) return true;
  tokens_.push_back(token);
  text_ = tokenizer_.decode(tokens_);
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, text_.find(s));
  if (cut != std::string::npos) {
    text_.resize(cut);
    stopped_ = true;
  }
  return stopped_;
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
