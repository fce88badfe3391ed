#pragma once
// Picking the next token from a row of logits: greedy (temperature 0), or sampling with
// temperature, top-k and top-p. The random number of a pick is a function of (seed, stream,
// index) alone — stream tells apart the completions of one request (OpenAI's `n`), index is
// the token's place in its completion — so a completion is the same text whatever batch it
// ran in, and on any layout.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace jumbo {

struct SamplingParams {
  double temperature = 0;  // 0 = greedy
  int64_t top_k = 0;       // 0 = all tokens
  double top_p = 1;        // nucleus: the smallest set of tokens holding this probability
  uint64_t seed = 0;
  int64_t logprobs = 0;    // also report this many most likely tokens (OpenAI's logprobs)
  // OpenAI's penalties, over the tokens generated so far (not the prompt, as vLLM): a token
  // that occurred c times loses c x frequency_penalty + presence_penalty (c > 0) of logit.
  double frequency_penalty = 0, presence_penalty = 0;
  std::vector<std::pair<int32_t, float>> logit_bias = {};  // added to those tokens' logits
  bool adjusts_logits() const {
    return frequency_penalty != 0 || presence_penalty != 0 || !logit_bias.empty();
  }
};

struct TokenPick {
  int32_t token = 0;
  float logprob = 0;  // the model's log-probability of the token (before temperature/filters)
  std::vector<std::pair<int32_t, float>> top;  // params.logprobs most likely, most likely first
};

// `logits` holds the real vocabulary (no padding). Deterministic: ties go to the lower id.
// `adjusted` (when not empty: the same row after apply_logit_adjustments) is what the token is
// picked from; logprob and top stay the model's (`logits`).
TokenPick pick_token(std::span<const float> logits, const SamplingParams& params,
                     uint64_t stream, int64_t index, std::span<const float> adjusted = {});

// The penalties and logit bias of `params` applied to `logits` in place. `generated` are the
// completion's tokens so far; `counts` is scratch of the vocabulary's size, all zero, and is
// left all zero.
void apply_logit_adjustments(std::span<float> logits, const SamplingParams& params,
                             std::span<const int32_t> generated, std::span<int32_t> counts);

// A prompt token's score (OpenAI's echo with logprobs): the model's log-probability of
// `target` and the `alternatives` most likely tokens.
TokenPick score_token(std::span<const float> logits, int32_t target, int64_t alternatives);

// The stream of completion `choice` of a prompt: its tokens hashed with the choice, so
// different prompts under one seed draw independent numbers, and a prompt's completion is
// the same wherever it runs (jumbo generate, the server, any batch).
uint64_t sampling_stream(const std::vector<int32_t>& prompt, int64_t choice);

// A uniform double in [0, 1) from the key (splitmix64-style counter hashing).
double uniform_of(uint64_t seed, uint64_t stream, int64_t index);

}  // namespace jumbo
