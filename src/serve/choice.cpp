#include "choice.h"

#include <fmt/format.h>

#include <algorithm>

#include "jumbo/data/utf8.h"

namespace jumbo::serve {

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  // Control and byte pieces, and added tokens, read as stored ("<0x0A>", "</s>", "<|eot_id|>").
  if (!tokenizer.is_learned(id)) return tokenizer.piece(id);
  // A learned token: the bytes it decodes to ("▁" a space); a byte-level token that holds part
  // of a character shows that part's bytes as byte pieces do ("<0xE2>"), so the key is JSON.
  const std::string bytes = tokenizer.token_bytes(id);
  if (is_valid_utf8(bytes)) return bytes;
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    size_t n = 1;
    while (i + n <= bytes.size() && n <= 4 && !is_valid_utf8(bytes.substr(i, n))) ++n;
    if (i + n <= bytes.size() && n <= 4) {
      out += bytes.substr(i, n);
      i += n;
    } else {
      out += fmt::format("<0x{:02X}>", static_cast<unsigned char>(bytes[i]));
      ++i;
    }
  }
  return out;
}

ChoiceState::ChoiceState(const Tokenizer& tokenizer, ChoiceOptions options)
    : tokenizer_(tokenizer),
      options_(std::move(options)),
      completion_(tokenizer, options_.stops, options_.prompt) {
  if (options_.echo) {
    const size_t from = std::min(options_.echo_from, options_.prompt.size());
    const std::vector<int32_t> shown(options_.prompt.begin() + static_cast<std::ptrdiff_t>(from),
                                     options_.prompt.end());
    echo_text_ = tokenizer_.decode(shown);
    if (options_.logprobs) echo_texts_ = token_texts(tokenizer_, shown);
  }
}

bool ChoiceState::add(const TokenEvent& e) {
  if (e.prompt) {
    if (options_.echo && options_.logprobs) prompt_scores_.push_back(e.pick);
    return true;
  }
  if (e.eos) {
    finish_ = FinishReason::stop;
    return false;
  }
  if (options_.max_tokens == 0) {
    finish_ = FinishReason::length;
    return false;
  }
  ++completion_tokens_;
  logprob_sum_ += e.pick.logprob;
  if (options_.logprobs) picks_.push_back(e.pick);
  if (completion_.add(e.pick.token)) {
    finish_ = FinishReason::stop;
    return false;
  }
  finish_ = e.finished;
  return true;
}

double ChoiceState::mean_logprob() const {
  return completion_tokens_ == 0 ? 0.0 : logprob_sum_ / static_cast<double>(completion_tokens_);
}

size_t ChoiceState::entries() const {
  return options_.logprobs ? echoed_tokens() + picks_.size() : 0;
}

std::vector<TokenEntry> ChoiceState::entries(size_t from, size_t to) const {
  std::vector<TokenEntry> out;
  const std::string& completion = completion_.text();
  const int64_t echo_chars = utf8_chars(echo_text_);
  for (size_t k = from; k < to; ++k) {
    TokenEntry e;
    const TokenPick* pick = nullptr;
    if (k < echoed_tokens()) {
      e.text = echo_texts_[k];
      size_t before = 0;
      for (size_t j = 0; j < k; ++j) before += echo_texts_[j].size();
      e.text_offset = utf8_chars(echo_text_.substr(0, before));
      if (k > 0 && k - 1 < prompt_scores_.size()) pick = &prompt_scores_[k - 1];
    } else {
      const size_t i = k - echoed_tokens();
      const size_t begin = completion_.token_begin(i);
      const size_t end = std::max(begin, completion_.token_end(i, finished()));
      e.text = completion.substr(begin, end - begin);
      e.text_offset = echo_chars + utf8_chars(completion.substr(0, begin));
      pick = &picks_[i];
    }
    if (pick) {
      e.logprob = pick->logprob;
      for (const auto& [id, lp] : pick->top) e.top.emplace_back(token_text(tokenizer_, id), lp);
    }
    out.push_back(std::move(e));
  }
  return out;
}

size_t ChoiceState::ready_entries() const {
  if (!options_.logprobs) return 0;
  if (finished()) return entries();
  // The echoed entries wait for every prompt score (they arrive before the first token).
  if (picks_.empty()) return 0;
  size_t ready = echoed_tokens();
  // A completion token is whole once the text sent so far holds all its bytes.
  while (ready - echoed_tokens() < picks_.size() &&
         completion_.token_end(ready - echoed_tokens(), false) <= completion_.sent()) {
    ++ready;
  }
  return ready;
}

std::optional<ChoiceState::Delta> ChoiceState::take_delta() {
  Delta d;
  if (options_.echo && !echo_sent_) {
    d.text = echo_text_;
    echo_sent_ = true;
  }
  d.text += completion_.take_delta(finished());
  d.from = entries_sent_;
  d.to = std::max(entries_sent_, ready_entries());
  d.finishing = finished() && !finish_sent_;
  if (d.text.empty() && d.to == d.from && !d.finishing) return std::nullopt;
  entries_sent_ = d.to;
  finish_sent_ = finished();
  return d;
}

}  // namespace jumbo::serve
