#pragma once
// TransformerDecoder: one pipeline stage of the model for generation, with a KV cache. A step carries
// N query rows, each a (token, cache slot, position): a prompt's prefill is its consecutive
// positions in one slot, a decode step one row per sequence, and one step may mix both, so
// requests join and leave a running batch (continuous batching). The weights are the stage's
// parameters as training registers them (stage_params), without gradients; tensor
// parallelism splits heads, the MLP and the vocabulary exactly as in training. Everything —
// weights, the cache, every step's tensors — is allocated once, from the shape.
//
// LoRA adapters over the one base (S-LoRA, Sheng et al. 2023; Punica's segmented products):
// a pool of shape.adapter_slots adapters, each up to shape.max_lora_rank on any of the four
// maps, allocated once; a row names its adapter's slot, and each run of rows of one adapter
// applies it (lora_forward), so one step mixes requests of many adapters and the base.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/model/transformer.h"
#include "jumbo/model/stage.h"
#include "jumbo/model/layer.h"
#include "jumbo/model/params.h"

namespace jumbo {

class TransformerDecoder final : public DecodeStage {
 public:
  // `stage` gives the stage's layers, embedding/head and compute dtype (a stage plan's
  // StageOptions; one model chunk, no sequence parallelism).
  TransformerDecoder(const ModelConfig& cfg, const StageOptions& stage, const DecodeShape& shape,
             Backend& backend, Comm& tp);

  ParamStore& params() override { return params_; }
  // Copies this stage's part of an adapter (its store laid out by lora_stage_params for
  // `lora`, in the compute dtype) into a pool slot, replacing what the slot held; rows may
  // name the slot from the next step. Throws std::logic_error on a slot outside the pool or a
  // rank above max_lora_rank (callers check both first).
  void set_adapter(int32_t slot, const ParamStore& adapter, const LoraShape& lora) override;
  void clear_adapter(int32_t slot) override;
  bool has_adapter(int32_t slot) const override;
  const DecodeShape& shape() const override { return shape_; }
  // One step of `rows` through this stage. The first stage embeds their tokens; the others
  // read their input from input(rows.size()). On the last stage the head computes the
  // logits of the rows `sampled` lists (indices into rows), in that order; its last layer
  // computes only the rows' keys and values for the others (their outputs reach nothing).
  void forward(std::span<const DecodeRow> rows, std::span<const int32_t> sampled) override;
  // Stage boundary tensors of a step of n rows: [n, C] (output: of a stage before the last).
  Tensor input(int64_t n) override { return x_.rows(0, n); }
  Tensor output(int64_t n) override { return x_.rows(0, n); }
  // f32 [count, vocab slice] of the last step's sampled rows; padded columns are -inf.
  Tensor logits(int64_t count) override { return logits_f32_.rows(0, count); }
  int64_t vocab_local() const override { return vocab_local_; }
  int64_t vocab_start() const override { return vocab_start_; }

 private:
  void layout_step(Arena& arena);
  // Runs of consecutive rows of one adapter: of the step's rows, and of its sampled rows in
  // their order (what the last layer keeps).
  void group_adapter_rows(std::span<const DecodeRow> rows, std::span<const int32_t> sampled);
  StageOptions pool_options() const;  // the stage's options with a pool slot's LoRA shape

  ModelConfig cfg_;
  StageOptions opts_;
  ModelSpec spec_;  // this rank's (spec_.tp: the tp size)
  DecodeShape shape_;
  Backend& backend_;
  Comm& tp_;
  int64_t tp_rank_, vocab_local_, vocab_start_, vocab_valid_;
  ParamStore params_;
  StageParamIndex ix_;
  Arena cache_arena_, step_arena_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [slots, kv heads, positions, head_dim]
  Tensor tokens_, positions_, rows_, picked_rows_;  // i32 [R], [R], [R, 2], [S]
  Tensor x_, pos_emb_, ln_, mean_, rstd_, qkv_, atty_, proj_, fch_, fch_act_;
  Tensor rope_table_;  // RoPE: f32 [cache positions, head_dim]
  Tensor qkv_raw_, qk_rstd_;  // qk-norm: the map's output before it, the heads' rstd
  Tensor picked_, picked_atty_, lnf_, lnf_mean_, lnf_rstd_, logits_, logits_f32_;
  std::vector<int32_t> host_tokens_, host_positions_, host_rows_, host_picked_;
  // LoRA: the pool (a store per slot, laid out for max_lora_rank on every map), each slot's
  // adapter as the layers run it (rank 0: empty), the step's row runs, and h / B's output.
  std::vector<std::unique_ptr<ParamStore>> adapter_pool_;
  std::vector<LoraAdapter> adapters_;
  std::vector<LoraRows> row_runs_, kept_runs_;
  Tensor lora_h_, lora_scratch_;
};

}  // namespace jumbo
