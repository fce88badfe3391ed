#pragma once
// One choice of a request (a completion of one prompt) as its events arrive: the text (the
// echoed prompt, then the completion cut at a stop string), each token's entry for logprobs,
// the finish reason, and what a stream may send next. Both endpoints build their JSON from
// it (completions.cpp, chat.cpp). add() runs in the leader's sink, the rest on a handler
// thread; the caller serialises them (the job's mutex).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/completion_text.h"
#include "jumbo/infer/scheduler.h"

namespace jumbo::serve {

struct ChoiceOptions {
  std::vector<std::string> stops;
  std::vector<int32_t> prompt;  // as the model sees it
  bool logprobs = false;        // keep token entries
  // Echo the prompt from this token on (1 skips the EOS a text prompt starts with); the
  // first echoed token has no logprob, as in OpenAI.
  bool echo = false;
  size_t echo_from = 0;
  int64_t max_tokens = 1;  // 0: echo only (the one token the engine generates is dropped)
};

// One token as logprobs shows it.
struct TokenEntry {
  std::string text;              // its bytes of the choice's text (the entries join to it)
  std::optional<float> logprob;  // none: the first echoed token
  std::vector<std::pair<std::string, float>> top;  // alternatives, most likely first
  int64_t text_offset = 0;       // characters of the choice's text before it
};

// How a token id reads as an alternative: a learned token's bytes (Tokenizer::token_bytes: "▁"
// as a space), bytes that are not whole UTF-8 characters as "<0xE2>"; byte pieces, control
// pieces and added tokens as stored ("<0x0A>", "<|eot_id|>"), so every key is one token.
std::string token_text(const Tokenizer& tokenizer, int32_t id);

class ChoiceState {
 public:
  ChoiceState(const Tokenizer& tokenizer, ChoiceOptions options);
  // The sink's work: false ends the sequence now (EOS, a stop string, max_tokens 0).
  bool add(const TokenEvent& e);
  bool finished() const { return finish_ != FinishReason::none; }
  FinishReason finish_reason() const { return finish_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  // OpenAI's best_of ranks by this: the completion tokens' mean log-probability.
  double mean_logprob() const;
  std::string text() const { return echo_text_ + completion_.text(); }
  size_t entries() const;
  std::vector<TokenEntry> entries(size_t from, size_t to) const;

  // A stream's next piece: text that can no longer change, the entries [from, to) that
  // became whole, and whether the finish reason goes with it. None: nothing new.
  struct Delta {
    std::string text;
    size_t from = 0, to = 0;
    bool finishing = false;
  };
  std::optional<Delta> take_delta();

 private:
  size_t echoed_tokens() const { return echo_texts_.size(); }
  size_t ready_entries() const;

  const Tokenizer& tokenizer_;
  ChoiceOptions options_;
  CompletionText completion_;
  std::string echo_text_;
  std::vector<std::string> echo_texts_;  // each echoed prompt token's text
  std::vector<TokenPick> prompt_scores_;  // of echoed tokens 1.. (the first has none)
  std::vector<TokenPick> picks_;          // of completion tokens (with logprobs)
  int64_t completion_tokens_ = 0;
  double logprob_sum_ = 0;
  FinishReason finish_ = FinishReason::none;
  bool echo_sent_ = false, finish_sent_ = false;
  size_t entries_sent_ = 0;
};

}  // namespace jumbo::serve
