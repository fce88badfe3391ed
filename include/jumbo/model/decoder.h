#pragma once
// GptDecoder: one pipeline stage of the model for generation, with a KV cache. A step carries
// N query rows, each a (token, cache slot, position): a prompt's prefill is its consecutive
// positions in one slot, a decode step one row per sequence, and one step may mix both, so
// requests join and leave a running batch (continuous batching). The weights are the stage's
// parameters as training registers them (gpt_stage_params), without gradients; tensor
// parallelism splits heads, the MLP and the vocabulary exactly as in training. Everything —
// weights, the cache, every step's tensors — is allocated once, from the shape.
#include <cstdint>
#include <span>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/model/gpt.h"
#include "jumbo/model/layer.h"
#include "jumbo/model/params.h"

namespace jumbo {

struct DecodeShape {
  int64_t max_rows = 1;         // query rows one step may carry (prefill chunks + decode rows)
  int64_t max_sampled = 1;      // rows a step computes logits for (sequences sampled per step)
  int64_t cache_slots = 1;      // sequences the KV cache holds at once
  int64_t cache_positions = 0;  // positions per sequence; 0 = model.context
};

struct DecodeRow {
  int32_t token = 0;     // read on the first stage
  int32_t slot = 0;      // the sequence's KV-cache slot
  int32_t position = 0;  // 0-based position in its sequence
};

class GptDecoder {
 public:
  // `stage` gives the stage's layers, embedding/head and compute dtype (a stage plan's
  // GptOptions; one model chunk, no sequence parallelism).
  GptDecoder(const ModelConfig& cfg, const GptOptions& stage, const DecodeShape& shape,
             Backend& backend, Comm& tp);

  ParamStore& params() { return params_; }
  const DecodeShape& shape() const { return shape_; }
  // One step of `rows` through this stage. The first stage embeds their tokens; the others
  // read their input from input(rows.size()). On the last stage the head computes the
  // logits of the rows `sampled` lists (indices into rows), in that order; its last layer
  // computes only the rows' keys and values for the others (their outputs reach nothing).
  void forward(std::span<const DecodeRow> rows, std::span<const int32_t> sampled);
  // Stage boundary tensors of a step of n rows: [n, C] (output: of a stage before the last).
  Tensor input(int64_t n) { return x_.rows(0, n); }
  Tensor output(int64_t n) { return x_.rows(0, n); }
  // f32 [count, vocab slice] of the last step's sampled rows; padded columns are -inf.
  Tensor logits(int64_t count) { return logits_f32_.rows(0, count); }
  int64_t vocab_local() const { return vocab_local_; }
  int64_t vocab_start() const { return vocab_start_; }

 private:
  void layout_step(Arena& arena);

  ModelConfig cfg_;
  GptOptions opts_;
  DecodeShape shape_;
  Backend& backend_;
  Comm& tp_;
  int64_t tp_rank_, heads_local_, ffn_local_, vocab_local_, vocab_start_, vocab_valid_;
  ParamStore params_;
  GptParamIndex ix_;
  Arena cache_arena_, step_arena_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [slots, heads, positions, head_dim]
  Tensor tokens_, positions_, rows_, picked_rows_;  // i32 [R], [R], [R, 2], [S]
  Tensor x_, pos_emb_, ln_, mean_, rstd_, qkv_, atty_, proj_, fch_, fch_gelu_;
  Tensor picked_, picked_atty_, lnf_, lnf_mean_, lnf_rstd_, logits_, logits_f32_;
  std::vector<int32_t> host_tokens_, host_positions_, host_rows_, host_picked_;
};

}  // namespace jumbo
