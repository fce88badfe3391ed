#include "jumbo/model/activations.h"

#include <algorithm>

#include "jumbo/model/transformer.h"
#include "jumbo/model/lora.h"

namespace jumbo {

StageActivations layout_stage_activations(Arena& arena, const ModelConfig& cfg,
                                          const StageOptions& opts, int64_t tp,
                                          int64_t stats_cols) {
  const ModelSpec spec = model_spec(cfg, tp);
  const DType t = opts.compute_dtype;
  const DType f32 = DType::f32;
  const bool sp_on = opts.sequence_parallel && tp > 1;
  const int64_t b = opts.micro_batch, s = opts.seq, n = b * s, c = spec.d_model;
  const int64_t sp = sp_on ? s / tp : s, np = b * sp;
  const int64_t qkv_local = spec.qkv_local(), attn_local = spec.attn_local();
  const int64_t up_local = spec.up_local(), ffn_local = spec.ffn_local();
  const int64_t heads_local = spec.heads_local();
  const int64_t vocab_local = cfg.padded_vocab(tp) / tp;
  const bool layernorm = spec.norm_has_bias();  // LayerNorm keeps the mean too
  const bool lora = opts.lora.rank > 0;
  const int64_t layers = opts.num_layers < 0 ? cfg.layers - opts.first_layer : opts.num_layers;
  StageActivations a;
  // A sequence-spanning tensor, or the part tensor itself without SP.
  auto full_of = [&](Tensor part) { return sp_on ? arena.alloc(t, {b, s, c}) : part; };
  // One full set of layer tensors: the shared set under recomputation, else the per-slot ones.
  auto alloc_layer = [&](LayerTensors& la, bool core_attention) {
    la.ln1 = arena.alloc(t, {b, sp, c});
    la.ln1_full = full_of(la.ln1);
    if (layernorm) la.ln1_mean = arena.alloc(f32, {np});
    la.ln1_rstd = arena.alloc(f32, {np});
    la.qkv = arena.alloc(t, {b, s, qkv_local});
    if (spec.qk_norm) {  // the map's output before the heads' RMSNorm, and their rstd
      la.qkv_raw = arena.alloc(t, {b, s, qkv_local});
      la.qk_rstd = arena.alloc(f32, {n, spec.heads_local() + spec.kv_heads_local()});
    }
    if (core_attention) {
      la.atty = arena.alloc(t, {b, s, attn_local});
      la.probs = arena.alloc(f32, {b, heads_local, s, stats_cols});
    }
    la.residual2 = arena.alloc(t, {b, sp, c});
    la.ln2 = arena.alloc(t, {b, sp, c});
    la.ln2_full = full_of(la.ln2);
    if (layernorm) la.ln2_mean = arena.alloc(f32, {np});
    la.ln2_rstd = arena.alloc(f32, {np});
    la.fch = arena.alloc(t, {b, s, up_local});
    la.fch_act = arena.alloc(t, {b, s, ffn_local});
    la.residual3 = arena.alloc(t, {b, sp, c});
    for (LoraTarget target : kLoraTargets) {
      if (lora && opts.lora.targets.has(target)) {
        la.lora_h[static_cast<size_t>(target)] = arena.alloc(t, {n, opts.lora.rank});
      }
    }
  };
  if (layers > 0 && opts.recompute == Recompute::full) alloc_layer(a.recomputed, true);
  if (layers > 0 && opts.recompute == Recompute::selective) {
    a.recomputed.atty = arena.alloc(t, {b, s, attn_local});
    a.recomputed.probs = arena.alloc(f32, {b, heads_local, s, stats_cols});
  }
  a.slots.assign(static_cast<size_t>(opts.slots), SlotActivations{});
  for (SlotActivations& slot : a.slots) {
    slot.tokens = arena.alloc(DType::i32, {n});
    slot.targets = arena.alloc(DType::i32, {n});
    slot.positions = arena.alloc(DType::i32, {n});
    slot.positions_part = sp_on ? arena.alloc(DType::i32, {b * sp}) : slot.positions;
    slot.encoded = arena.alloc(t, {b, sp, c});
    if (!opts.has_embedding || opts.chunks > 1) slot.dinput = arena.alloc(t, {b, sp, c});
    for (int64_t l = 0; l < layers; ++l) {
      LayerTensors la = a.recomputed;
      switch (opts.recompute) {
        case Recompute::none: alloc_layer(la, true); break;
        case Recompute::full: la.residual3 = arena.alloc(t, {b, sp, c}); break;
        case Recompute::selective: alloc_layer(la, false); break;  // probs, atty shared
      }
      slot.layers.push_back(la);
    }
  }
  if (opts.has_head) {
    a.lnf = arena.alloc(t, {b, sp, c});
    a.lnf_full = full_of(a.lnf);
    if (layernorm) a.lnf_mean = arena.alloc(f32, {np});
    a.lnf_rstd = arena.alloc(f32, {np});
    a.logits = arena.alloc(t, {n, vocab_local});
    a.ce_max = arena.alloc(f32, {n});
    a.ce_sumexp = arena.alloc(f32, {n});
    a.ce_target = arena.alloc(f32, {n});
    a.losses = arena.alloc(f32, {n});
    a.loss_record = arena.alloc(f32, {opts.losses_per_read * n});
  }
  a.proj_out = arena.alloc(t, {b, s, c});
  a.proj_part = sp_on ? arena.alloc(t, {b, sp, c}) : a.proj_out;
  a.emb_full = opts.has_embedding && sp_on ? arena.alloc(t, {b, s, c}) : Tensor{};
  a.dresidual = arena.alloc(t, {b, sp, c});
  a.dres_full = full_of(a.dresidual);
  a.dln = arena.alloc(t, {b, s, c});
  a.dln_part = sp_on ? arena.alloc(t, {b, sp, c}) : a.dln;
  a.sp_stage = sp_on ? arena.alloc(t, {b * s * c}) : Tensor{};
  a.datty = arena.alloc(t, {b, s, attn_local});
  a.dqkv = arena.alloc(t, {b, s, qkv_local});
  a.dfch = arena.alloc(t, {b, s, up_local});
  a.dfch_act = arena.alloc(t, {b, s, ffn_local});
  a.dprobs = arena.alloc(f32, {b, heads_local, s, stats_cols});
  if (lora) {
    // The widest map's output (qkv's, fc1's, proj's and fc2's C) and dx's widest input (C,
    // F/tp): B's output in the forward, dh A in the backward.
    a.lora_scratch = arena.alloc(t, {n * std::max({qkv_local, up_local, ffn_local, c})});
    a.lora_dh = arena.alloc(t, {n, opts.lora.rank});
    int64_t part = 0;  // the widest adapted part of a packed output
    for (LoraTarget target : kLoraTargets) {
      if (!opts.lora.targets.has(target)) continue;
      if (lora_output_blocks(spec, target).block == 0) continue;
      const int64_t width = target == LoraTarget::q ? spec.heads_local() * spec.head_dim
                            : target == LoraTarget::k || target == LoraTarget::v
                                ? spec.kv_heads_local() * spec.head_dim
                                : spec.ffn_local();
      part = std::max(part, width);
    }
    if (part > 0) a.lora_dout = arena.alloc(t, {n * part});
    // The widest input of a map: C (qkv, fc1), attention's width / tp (proj), F/tp (fc2).
    if (opts.lora_dropout > 0) {
      a.lora_dropped = arena.alloc(t, {n * std::max({c, attn_local, ffn_local})});
    }
    a.frozen_norm_w = arena.alloc(f32, {c});
    a.frozen_norm_b = arena.alloc(f32, {c});
  }
  if (spec.rope()) {
    a.rope_table = arena.alloc(f32, {spec.context, spec.head_dim});
    a.sequence_positions = arena.alloc(DType::i32, {n});
  }
  return a;
}

int64_t stage_activation_bytes(const ModelConfig& cfg, const StageOptions& opts, int64_t tp,
                               int64_t stats_cols) {
  Arena counting;
  layout_stage_activations(counting, cfg, opts, tp, stats_cols);
  return static_cast<int64_t>(counting.used());
}

int64_t kv_cache_bytes_per_token(const ModelConfig& cfg, Precision precision) {
  const ModelSpec spec = model_spec(cfg);
  return 2 * spec.layers * spec.kv_heads * spec.head_dim *
         static_cast<int64_t>(dtype_size(compute_dtype_of(precision)));
}

}  // namespace jumbo
