#pragma once
// OpenAI's legacy completions API as data: a /v1/completions body parsed and validated into
// generation requests, each choice's text, logprobs and finish reason built as its tokens
// arrive, and the response, stream chunk and error JSON. No HTTP and no threads here
// (server.cpp has both). docs/serve.md describes the fields.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/completion_text.h"
#include "jumbo/infer/scheduler.h"

namespace jumbo::serve {

using json = nlohmann::json;

inline constexpr int64_t kMaxN = 16;            // completions per prompt
inline constexpr int64_t kMaxStops = 4;         // stop strings
inline constexpr int64_t kMaxLogprobs = 5;      // alternatives per token
inline constexpr int64_t kMaxChoices = 64;      // prompts x n in one request
inline constexpr int64_t kDefaultMaxTokens = 16;

// What a client gets back as {"error": {...}} with this HTTP status. `param` names the
// field at fault ("" = null: the body as a whole, or no field).
struct ApiError : std::runtime_error {
  ApiError(int status, std::string param, const std::string& message,
           std::string type = "invalid_request_error")
      : std::runtime_error(message), status(status), param(std::move(param)),
        type(std::move(type)) {}
  int status;
  std::string param;
  std::string type;
};

// The served model as validation needs it.
struct ServedModel {
  std::string name;
  DecodeShape shape;  // cache_positions: prompt + completion tokens per sequence
  int64_t vocab = 0;
};

struct CompletionRequest {
  std::vector<std::vector<int32_t>> prompts;  // token ids as the model sees them
  int64_t max_tokens = kDefaultMaxTokens;
  SamplingParams sampling;  // seed: the request's, or 0 with seeded false
  bool seeded = false;
  int64_t n = 1;
  std::vector<std::string> stop;
  bool logprobs = false;  // report logprobs (with sampling.logprobs alternatives)
  bool stream = false;
  int64_t choices() const { return static_cast<int64_t>(prompts.size()) * n; }
};

// Throws ApiError (400) with one line naming the field: invalid JSON, an unknown field, a
// wrong type or range, the wrong model, a prompt that does not fit the context.
CompletionRequest parse_completion_request(const std::string& body, const ServedModel& model,
                                           const Tokenizer& tokenizer);

// Choice `choice` (= prompt x n + j) runs stream j of the request's seed, as OpenAI's `n`
// and `jumbo generate --seed` (stream 0) agree.
GenerationRequest generation_request(const CompletionRequest& r, int64_t choice);

// One choice as its tokens arrive. add() runs in the leader's sink; take_chunk() and
// to_json() on a handler thread; the caller serialises them (the job's mutex).
class ChoiceState {
 public:
  ChoiceState(const Tokenizer& tokenizer, const std::vector<std::string>& stops, bool logprobs);
  // The sink's work: false ends the sequence now (EOS or a stop string: finish "stop").
  // An EOS is neither text nor a completion token, as in `jumbo generate`.
  bool add(const TokenEvent& e);
  bool finished() const { return finish_ != FinishReason::none; }
  int64_t completion_tokens() const { return tokens_; }
  // Non-stream: {index, text, logprobs, finish_reason} of the whole choice.
  json to_json(int64_t index) const;
  // Stream: the same for what arrived since the last call (text that can no longer become
  // part of a stop string; the new tokens' logprobs), or null when there is nothing to send.
  json take_chunk(int64_t index);

 private:
  struct TokenLog {
    int32_t token = 0;
    float logprob = 0;
    std::vector<std::pair<int32_t, float>> top;
    int64_t text_offset = 0;  // characters of the completion's text before this token
  };
  json logprobs_json(size_t from, size_t to) const;

  const Tokenizer& tokenizer_;
  CompletionText text_;
  bool logprobs_;
  std::vector<TokenLog> log_;
  size_t log_sent_ = 0;
  int64_t tokens_ = 0;
  FinishReason finish_ = FinishReason::none;
  bool finish_sent_ = false;
};

// The pieces of a response every chunk and the final body share.
struct ResponseHead {
  std::string id;  // "cmpl-N"
  int64_t created = 0;
  std::string model;
};

json completion_response(const ResponseHead& head, const std::vector<ChoiceState>& choices,
                         const CompletionRequest& request);
// "data: {...}\n\n" of one choice's chunk.
std::string stream_event(const ResponseHead& head, const json& choice);
json error_json(const ApiError& e);
// JSON text; invalid UTF-8 (a completion cut inside a character) becomes U+FFFD.
std::string dump(const json& j);

}  // namespace jumbo::serve
