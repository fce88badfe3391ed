#pragma once
// The activation tensors of one training stage, written once: layout_stage_activations
// allocates them from an arena in TransformerStage's order (TransformerStage::layout_activations takes its
// tensors from it), and the planner (plan/memory.cpp) runs it on a counting arena, so a plan's
// activations are the bytes a stage allocates, GPT or Llama alike: every width comes from
// ModelSpec (qkv_local: grouped-query attention's smaller q k v; up_local: SwiGLU's gate and
// up side by side; the norm statistics with LayerNorm's mean or RMSNorm's rstd alone; qk-norm's
// pre-norm q k v and per-head rstd; RoPE's table and positions).
//
// Also the decoder's KV cache per token (model/decoder.h), for the lines that size generation.
#include <cstdint>
#include <vector>

#include "jumbo/backend/arena.h"
#include "jumbo/config/config.h"
#include "jumbo/model/layer.h"
#include "jumbo/model/spec.h"

namespace jumbo {

struct StageOptions;  // model/stage.h

// One microbatch in flight: its ids, its stage input (and its gradient, sent back), and its
// layers' tensors. `input`, `proj_full`, `proj_part` and LoRA's row/scratch views of each
// layer are left for the model to wire (they are other tensors of the stage).
struct SlotActivations {
  Tensor tokens, targets, encoded, dinput;
  // Packed sequences: positions of the whole sequence and of this rank's part (the same tensor
  // without sequence parallelism).
  Tensor positions, positions_part;
  std::vector<LayerTensors> layers;
};

struct StageActivations {
  // Layer tensors recomputation does not keep per slot (full: a whole layer's; selective: the
  // attention core's atty and probs).
  LayerTensors recomputed;
  std::vector<SlotActivations> slots;
  // The head's, last stage only (it runs one microbatch's forward and backward back to back).
  Tensor lnf, lnf_full, lnf_mean, lnf_rstd, logits, ce_max, ce_sumexp, ce_target, losses;
  Tensor loss_record;  // f32 [losses_per_read x micro_batch x seq]
  // Scratch shared by all slots: "full" tensors span the sequence, "part" ones this rank's
  // part (aliases without sequence parallelism); sp_stage reorders [B, S, C] as [tp, B, S/tp, C].
  Tensor emb_full, proj_out, proj_part, dresidual, dres_full, dln, dln_part, sp_stage;
  Tensor datty, dqkv, dfch, dfch_act, dprobs;
  // LoRA: B's output (and dx's share), scale dout B, the dropped-out input, and what a frozen
  // norm's backward writes.
  Tensor lora_scratch, lora_dh, lora_dropped, frozen_norm_w, frozen_norm_b;
  Tensor lora_dout;  // an adapter's part of a packed output's gradient (q, k, v, gate, up)
  // RoPE: f32 [context, head_dim] cos and sin, and i32 [B*S] 0 .. seq-1 per sequence.
  Tensor rope_table, sequence_positions;
};

// The activations of a stage with `opts` on one of `tp` ranks. `stats_cols` is the backend's
// attention_stats_cols(opts.seq): the columns of the f32 [B, H/tp, S, stats_cols] attention
// statistics (the CPU keeps S x S probabilities, a GPU one log-sum-exp per row).
StageActivations layout_stage_activations(Arena& arena, const ModelConfig& cfg,
                                          const StageOptions& opts, int64_t tp,
                                          int64_t stats_cols);
// Their bytes: layout_stage_activations on a counting arena (its 64-byte alignment included).
int64_t stage_activation_bytes(const ModelConfig& cfg, const StageOptions& opts, int64_t tp,
                               int64_t stats_cols);

// The decoder's KV cache (decoder.cpp: per layer K and V, [slots, kv_heads / tp, positions,
// head_dim] in the compute dtype): bytes per token of a sequence over the whole model,
// 2 x layers x kv_heads x head_dim x the dtype's size. Split over tp (heads) and pp (layers).
int64_t kv_cache_bytes_per_token(const ModelConfig& cfg, Precision precision);

}  // namespace jumbo
