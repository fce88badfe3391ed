#pragma once
// OpenAI's completions API as data: a /v1/completions body (and the fields that
// /v1/chat/completions shares, chat.cpp) parsed and validated into generation requests, and
// the response and stream chunk JSON built from the choices. No HTTP and no threads here
// (server.cpp has both). docs/serve.md describes the fields.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "adapters.h"
#include "choice.h"
#include "jumbo/data/chat_template.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/scheduler.h"
#include "request_body.h"

namespace jumbo::serve {

inline constexpr int64_t kMaxN = 16;            // completions per prompt (n, best_of)
inline constexpr int64_t kMaxStops = 4;         // stop strings
inline constexpr int64_t kMaxLogprobs = 5;      // alternatives per token (completions)
inline constexpr int64_t kMaxTopLogprobs = 20;  // alternatives per token (chat)
inline constexpr int64_t kMaxChoices = 64;      // prompts x best_of in one request
inline constexpr int64_t kMaxLogitBias = 300;   // tokens in logit_bias
inline constexpr int64_t kDefaultMaxTokens = 16;

enum class Endpoint { completions, chat };

// The served model as validation needs it.
struct ServedModel {
  std::string name;
  DecodeShape shape;  // cache_positions: prompt + completion tokens per sequence
  int64_t vocab = 0;
  // A prompt text longer than this cannot fit the context, whatever it encodes to: refused
  // before it is tokenized (context x the longest piece's bytes).
  int64_t max_prompt_bytes = 0;
  std::optional<ChatTemplate> chat_template;
  // The LoRA adapters served over the base, which a request's "model" may name (adapters.h).
  AdapterTable* adapters = nullptr;
};

// One request of either endpoint, ready to run.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::completions;
  std::vector<std::vector<int32_t>> prompts;  // token ids as the model sees them
  std::vector<size_t> shown_from;             // per prompt: its first token of the user's text
  int64_t max_tokens = kDefaultMaxTokens;     // 0: echo only
  SamplingParams sampling;  // seed: the request's, or 0 with seeded false
  bool seeded = false;
  int64_t n = 1;
  int64_t best_of = 1;  // candidates run per prompt; the n of highest mean logprob return
  std::vector<std::string> stop;
  bool logprobs = false;  // report logprobs (with sampling.logprobs alternatives)
  bool echo = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // vLLM's extension: EOS is a token like any other (benchmarks)
  std::string model;           // "model": the base's name or an adapter's
  // An adapter's: the hold on it while the request lives (adapters.h); null for the base.
  std::shared_ptr<const AdapterUse> adapter;
  int64_t sequences() const { return static_cast<int64_t>(prompts.size()) * best_of; }
  int64_t prompt_tokens() const;
};

// Throws ApiError: 400 with one line naming the field (invalid JSON, an unknown field, a
// wrong type or range, a prompt that does not fit the context), 404 for another model.
CompletionRequest parse_completion_request(const std::string& body, const ServedModel& model,
                                           const Tokenizer& tokenizer);

// The fields both endpoints share (model, sampling, n, stop, seed, penalties, stream...).
// `known` lists the endpoint's fields, for the unknown-field error.
// 404 model_not_found for a "model" that is neither the base nor an adapter (names them).
ApiError model_not_found(const json& given, const ServedModel& model);
void parse_shared_fields(const json& body, const ServedModel& model,
                         const std::vector<std::string>& known, CompletionRequest& r);
// After the prompts are known: n x prompts, and the engine's own rules with field names.
void check_request_fits(CompletionRequest& r, const ServedModel& model);

// Sequence `sequence` (= prompt x best_of + j) runs stream j of the request's seed, as
// OpenAI's `n` and `jumbo generate --seed` (stream 0) agree.
GenerationRequest generation_request(const CompletionRequest& r, int64_t sequence);
ChoiceOptions choice_options(const CompletionRequest& r, int64_t sequence);

// The sequences returned, in order: per prompt, the n of best_of with the highest mean
// logprob (all of them, in order, when best_of = n).
std::vector<size_t> returned_choices(const CompletionRequest& r,
                                     const std::vector<ChoiceState>& sequences);

// The pieces of a response every chunk and the final body share.
struct ResponseHead {
  std::string id;  // "cmpl-" + random
  int64_t created = 0;
  std::string model;
};

json usage_json(const CompletionRequest& r, const std::vector<ChoiceState>& sequences);
// A whole (non-streamed) response: the head, the returned choices with their index and
// finish_reason around what `content` makes of each (the endpoint's fields), the usage.
json response_json(const ResponseHead& head, const CompletionRequest& r,
                   const std::vector<ChoiceState>& sequences,
                   const std::function<json(const ChoiceState&)>& content);
json completion_response(const ResponseHead& head, const std::vector<ChoiceState>& sequences,
                         const CompletionRequest& request);
// The choice's part of a stream chunk, or null when it has nothing new.
json completion_chunk_choice(ChoiceState& choice, int64_t index, bool logprobs);
// "data: {...}\n\n" of a chunk with these choices (and "usage": null with include_usage),
// and the last one before [DONE] with include_usage: no choices, the usage.
std::string stream_event(const ResponseHead& head, const CompletionRequest& r, json choices);
std::string usage_event(const ResponseHead& head, const CompletionRequest& r,
                        const std::vector<ChoiceState>& sequences);

}  // namespace jumbo::serve
