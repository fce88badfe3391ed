#pragma once
// Scheduler: continuous batching on world rank 0 (Orca, Yu et al. 2022). Requests wait in
// arrival order for a KV-cache slot; each engine step carries one decode row per running
// sequence and fills the rest of the step's rows with chunks of waiting prompts (chunked
// prefill), so a request joins at the next step and leaves — freeing its slot — the step it
// finishes. Decode rows are grouped by LoRA adapter, so each adapter runs on one block of
// rows (the engine applies each row's own adapter in any order; blocks make fewer products). One thread calls it (the leader's loop); the callers' sinks run on that thread.
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "jumbo/infer/engine.h"

namespace jumbo {

enum class FinishReason { none, length, stop };  // OpenAI's finish_reason: "length", "stop"
const char* to_string(FinishReason r);

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, not empty
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  // Which completion of its request this is (OpenAI's n); the picks are keyed by
  // sampling_stream(prompt, stream) (sampling.h).
  uint64_t stream = 0;
  bool stop_at_eos = true;
  // > 0: also score the prompt's tokens from this position on (OpenAI's echo with logprobs);
  // each score reaches the sink as an event with `prompt` set, in order, before any token.
  int64_t score_prompt_from = 0;
  // The LoRA adapter's slot in the engine (GenerationEngine::load_adapter), or -1: the base.
  int32_t adapter = -1;
};

// What a sink sees after each generated token. `finished` with reason length or stop (EOS,
// which is not part of the text: `eos` is set) when the scheduler ends the sequence.
struct TokenEvent {
  TokenPick pick;
  int64_t index = 0;  // 0-based within the completion (a prompt score: within the prompt)
  bool prompt = false;  // a score of prompt token `index`, not a generated token
  bool eos = false;
  FinishReason finished = FinishReason::none;
};
// Returns false to end the sequence now (a stop string matched, the client went away).
using TokenSink = std::function<bool(const TokenEvent&)>;

// Why a request cannot run on this engine, or "" (field names as the HTTP API's).
std::string request_problem(const GenerationRequest& r, const DecodeShape& shape,
                            int64_t vocab);

class Scheduler {
 public:
  explicit Scheduler(GenerationEngine& engine, int32_t eos_id);
  // Queues a request (request_problem must be ""); returns its id.
  int64_t submit(GenerationRequest request, TokenSink sink);
  // Ends a request at the next step (its sink is not called again).
  void cancel(int64_t id);
  // One engine step (collective: the followers run it too). Call while !idle().
  void step();
  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // KV-cache positions the running sequences hold.
  int64_t cached_positions() const;
  // Whether a request not cancelled, waiting or running, runs this adapter slot.
  bool uses_adapter(int32_t slot) const;
  // Steps so far whose rows ran more than one model (adapters, or adapters and the base).
  int64_t mixed_steps() const { return mixed_steps_; }

 private:
  struct Sequence {
    int64_t id = 0;
    GenerationRequest request;
    TokenSink sink;
    std::vector<int32_t> tokens;  // prompt, then generated
    int64_t cached = 0;           // positions already in the KV cache
    uint64_t key = 0;             // sampling_stream(prompt, request.stream)
    int64_t generated = 0;
    int32_t slot = -1;
    bool cancelled = false;
  };
  void admit();
  void finish(size_t running_index);

  GenerationEngine& engine_;
  int32_t eos_id_;
  int64_t next_id_ = 0;
  std::deque<Sequence> waiting_;
  std::vector<Sequence> running_;
  std::vector<int32_t> free_slots_;
  EngineStep step_;
  int64_t mixed_steps_ = 0;
  std::vector<size_t> decode_order_;  // running indices, grouped by adapter
  std::vector<size_t> sampled_of_;    // running index of each sampled row
  std::vector<int64_t> scored_at_;    // its prompt position when scored, else -1
};

// Runs every request to the end on this engine (the leader; followers are in follow()) and
// returns each one's generated tokens and finish reason, in request order. `stop_here`
// (optional) is asked after each token with the request's index and its tokens so far: true
// ends it with reason stop (stop strings).
struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::none;
};
using StopCheck = std::function<bool(size_t, const std::vector<int32_t>&)>;
std::vector<Generated> generate_all(GenerationEngine& engine, int32_t eos_id,
                                    const std::vector<GenerationRequest>& requests,
                                    const StopCheck& stop_here = {});

}  // namespace jumbo
