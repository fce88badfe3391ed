#include "jumbo/model/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "jumbo/model/checkpoint_names.h"
#include "jumbo/model/lora.h"

namespace jumbo {

GptModel::GptModel(const ModelConfig& cfg, const GptOptions& opts, Backend& backend, Comm& tp)
    : cfg_(cfg), opts_(opts), backend_(backend), tp_(tp), region_(backend, tp) {
  tp_rank_ = tp.rank();
  tp_size_ = tp.size();
  if (opts_.seq <= 0 || opts_.seq > cfg_.context) {
    throw std::logic_error(fmt::format("GptModel: seq {} outside (0, context {}]", opts_.seq,
                                       cfg_.context));
  }
  if (opts_.num_layers < 0) opts_.num_layers = cfg_.layers - opts_.first_layer;
  if (opts_.first_layer < 0 || opts_.chunks < 1 ||
      opts_.first_layer + (opts_.chunks - 1) * opts_.chunk_stride + opts_.num_layers > cfg_.layers ||
      opts_.slots < 1) {
    throw std::logic_error("GptModel: stage layers or slots out of range");
  }
  vocab_padded_ = cfg_.padded_vocab(tp_size_);
  vocab_local_ = vocab_padded_ / tp_size_;
  vocab_start_ = tp_rank_ * vocab_local_;
  vocab_valid_ = std::clamp<int64_t>(cfg_.vocab - vocab_start_, 0, vocab_local_);
  heads_local_ = cfg_.heads / tp_size_;
  ffn_local_ = cfg_.ffn_dim() / tp_size_;
  sp_ = opts_.sequence_parallel && tp_size_ > 1;
  if (sp_ && opts_.seq % tp_size_ != 0) {
    throw std::logic_error("GptModel: sequence parallelism needs seq divisible by tp");
  }
  seq_part_ = sp_ ? opts_.seq / tp_size_ : opts_.seq;
  lora_ = opts_.lora.rank > 0;
  register_params();
  // LoRA's base trains nothing: weights only, in the compute dtype (bf16 in mixed precision).
  params_.allocate(backend_, opts_.compute_dtype, opts_.flat_multiple,
                   lora_ ? GradBuffer::none : GradBuffer::allocated);
  if (lora_) {
    adapters_.allocate(backend_, opts_.compute_dtype, opts_.flat_multiple);
    adapter_ = {.store = &adapters_, .rank = opts_.lora.rank, .targets = opts_.lora.targets,
                .scale = static_cast<float>(opts_.lora.scale())};
    every_row_ = {.begin = 0, .count = opts_.micro_batch * opts_.seq, .adapter = &adapter_};
  }
  Arena counting;
  layout_activations(counting);
  acts_arena_ = backend_.device().make_arena(counting.used(), "activations");
  layout_activations(acts_arena_);
  if (sp_) {
    region_ = TensorParallelRegion(backend_, tp_, {.batch = opts_.micro_batch, .seq = opts_.seq,
                                                   .width = cfg_.d_model, .stage = sp_stage_});
  }
  host_losses_.resize(opts_.has_head ? opts_.losses_per_read * opts_.micro_batch * opts_.seq : 0);
  if (sp_) host_positions_part_.resize(static_cast<size_t>(opts_.micro_batch * seq_part_));
}

KernelRequirements kernel_requirements(const ModelConfig& cfg, const GptOptions& opts) {
  return {.head_dim = cfg.head_dim(), .compute_dtype = opts.compute_dtype};
}

std::vector<ParamInfo> gpt_stage_params(const ModelConfig& cfg, const GptOptions& opts,
                                        int64_t tp_rank, int64_t tp_size) {
  std::vector<ParamInfo> out;
  const int64_t c = cfg.d_model, f = cfg.ffn_dim(), l = cfg.layers;
  const int64_t c3 = 3 * c, c3_local = c3 / tp_size, c_local = c / tp_size;
  const int64_t ffn_local = f / tp_size;
  const int64_t vocab_padded = cfg.padded_vocab(tp_size), vocab_local = vocab_padded / tp_size;
  const int64_t num_layers = opts.num_layers < 0 ? l - opts.first_layer : opts.num_layers;
  const float std = 0.02f;
  // GPT-2/3: residual output projections scaled by 1/sqrt(2 x layers).
  const float resid_std = std / std::sqrt(2.0f * static_cast<float>(l));
  const auto N = InitKind::normal, ONE = InitKind::ones, ZERO = InitKind::zeros;
  // Sequence parallelism splits the norms' and the position embedding's inputs over tp.
  const bool sp = opts.sequence_parallel && tp_size > 1;
  auto sequence_split = [sp](ParamInfo p) {
    p.tp_partial_grad = sp;
    return p;
  };
  // The tied embedding comes first in the flat buffer on the first and the last stage: its
  // gradient is final only after the embedding-group sum, so its bucket is reduced last.
  if (opts.has_embedding || opts.has_head) {
    ParamInfo wte = make_param(kGptWordEmbedding, {vocab_padded, c}, {tp_rank * vocab_local, 0},
                               {vocab_local, c}, N, std, true, false);
    wte.tied_embedding = true;
    wte.pipeline_copy = !opts.has_embedding;
    wte.valid_rows = cfg.vocab;
    out.push_back(wte);
  }
  if (opts.has_embedding) {
    out.push_back(sequence_split(make_param("embedding.position", {cfg.context, c}, {0, 0},
                                            {cfg.context, c}, N, std, true, true)));
  }
  for (int64_t chunk = 0; chunk < opts.chunks; ++chunk)
  for (int64_t i = opts.first_layer + chunk * opts.chunk_stride;
       i < opts.first_layer + chunk * opts.chunk_stride + num_layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    out.push_back(sequence_split(make_param(p + "ln1.weight", {c}, {0}, {c}, ONE, 0, false, true)));
    out.push_back(sequence_split(make_param(p + "ln1.bias", {c}, {0}, {c}, ZERO, 0, false, true)));
    // Column-parallel QKV: rows ordered per head (q, k, v), so a tp rank's heads are contiguous.
    out.push_back(make_param(p + "attn.qkv.weight", {c3, c}, {tp_rank * c3_local, 0},
                             {c3_local, c}, N, std, true, false));
    out.push_back(make_param(p + "attn.qkv.bias", {c3}, {tp_rank * c3_local}, {c3_local}, ZERO, 0,
                             false, false));
    // Row-parallel output projection: columns split.
    out.push_back(make_param(p + "attn.proj.weight", {c, c}, {0, tp_rank * c_local},
                             {c, c_local}, N, resid_std, true, false));
    out.push_back(make_param(p + "attn.proj.bias", {c}, {0}, {c}, ZERO, 0, false, true));
    out.push_back(sequence_split(make_param(p + "ln2.weight", {c}, {0}, {c}, ONE, 0, false, true)));
    out.push_back(sequence_split(make_param(p + "ln2.bias", {c}, {0}, {c}, ZERO, 0, false, true)));
    out.push_back(make_param(p + "mlp.fc1.weight", {f, c}, {tp_rank * ffn_local, 0},
                             {ffn_local, c}, N, std, true, false));
    out.push_back(make_param(p + "mlp.fc1.bias", {f}, {tp_rank * ffn_local}, {ffn_local}, ZERO, 0,
                             false, false));
    out.push_back(make_param(p + "mlp.fc2.weight", {c, f}, {0, tp_rank * ffn_local},
                             {c, ffn_local}, N, resid_std, true, false));
    out.push_back(make_param(p + "mlp.fc2.bias", {c}, {0}, {c}, ZERO, 0, false, true));
  }
  if (opts.has_head) {
    out.push_back(sequence_split(make_param("final_norm.weight", {c}, {0}, {c}, ONE, 0, false, true)));
    out.push_back(sequence_split(make_param("final_norm.bias", {c}, {0}, {c}, ZERO, 0, false, true)));
  }
  return out;
}

GptParamIndex gpt_param_index(const GptOptions& opts) {
  // gpt_stage_params' order: [word], [position], 12 per layer, [final norm].
  GptParamIndex ix;
  int next = 0;
  if (opts.has_embedding || opts.has_head) ix.wte = next++;
  if (opts.has_embedding) ix.wpe = next++;
  const int64_t layers = opts.chunks * opts.num_layers;
  for (int64_t i = 0; i < layers; ++i) {
    GptLayerParams lp{};
    for (int* f : {&lp.ln1_w, &lp.ln1_b, &lp.qkv_w, &lp.qkv_b, &lp.proj_w, &lp.proj_b, &lp.ln2_w,
                   &lp.ln2_b, &lp.fc1_w, &lp.fc1_b, &lp.fc2_w, &lp.fc2_b}) {
      *f = next++;
    }
    ix.layers.push_back(lp);
  }
  if (opts.has_head) {
    ix.lnf_w = next++;
    ix.lnf_b = next++;
  }
  return ix;
}

void GptModel::register_params() {
  for (ParamInfo& p : gpt_stage_params(cfg_, opts_, tp_rank_, tp_size_)) params_.add(std::move(p));
  const GptParamIndex ix = gpt_param_index(opts_);
  wte_ = ix.wte;
  wpe_ = ix.wpe;
  lnf_w_ = ix.lnf_w;
  lnf_b_ = ix.lnf_b;
  layer_params_ = ix.layers;
  if (!lora_) return;
  for (ParamInfo& p : lora_stage_params(cfg_, opts_, tp_rank_, tp_size_)) adapters_.add(std::move(p));
  const std::vector<LoraLayerParams> adapters = lora_layer_index(opts_);
  for (size_t l = 0; l < layer_params_.size(); ++l) layer_params_[l].lora = adapters[l];
}

int64_t GptModel::layer_weights_end(const LayerParams& p) const {
  if (!lora_) {
    return flat_end({p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.proj_w, p.proj_b, p.ln2_w, p.ln2_b,
                     p.fc1_w, p.fc1_b, p.fc2_w, p.fc2_b});
  }
  int64_t end = 0;
  for (LoraTarget t : kLoraTargets) {
    if (!p.lora.has(t)) continue;
    const ParamInfo& b = adapters_.info(p.lora.b[static_cast<size_t>(t)]);
    end = std::max(end, b.flat_offset + b.numel());
  }
  return end;
}

void GptModel::layout_activations(Arena& arena) {
  const DType t = opts_.compute_dtype;
  const DType f32 = DType::f32;
  const int64_t b = opts_.micro_batch, s = opts_.seq, n = b * s, c = cfg_.d_model;
  const int64_t c_local = c / tp_size_, sp = seq_part_, np = b * sp;
  const int64_t stats_cols = backend_.attention_stats_cols(s);  // T x T probs on the CPU
  // A sequence-spanning tensor, or the part tensor itself without SP.
  auto full_of = [&](Tensor part) { return sp_ ? arena.alloc(t, {b, s, c}) : part; };
  // One full set of layer tensors: the shared set under recomputation, else the per-slot ones.
  auto alloc_layer = [&](LayerActs& la, bool core_attention) {
    la.ln1 = arena.alloc(t, {b, sp, c});
    la.ln1_full = full_of(la.ln1);
    la.ln1_mean = arena.alloc(f32, {np});
    la.ln1_rstd = arena.alloc(f32, {np});
    la.qkv = arena.alloc(t, {b, s, 3 * c_local});
    if (core_attention) {
      la.atty = arena.alloc(t, {b, s, c_local});
      la.probs = arena.alloc(f32, {b, heads_local_, s, stats_cols});
    }
    la.residual2 = arena.alloc(t, {b, sp, c});
    la.ln2 = arena.alloc(t, {b, sp, c});
    la.ln2_full = full_of(la.ln2);
    la.ln2_mean = arena.alloc(f32, {np});
    la.ln2_rstd = arena.alloc(f32, {np});
    la.fch = arena.alloc(t, {b, s, ffn_local_});
    la.fch_gelu = arena.alloc(t, {b, s, ffn_local_});
    la.residual3 = arena.alloc(t, {b, sp, c});
    for (LoraTarget target : kLoraTargets) {
      if (lora_ && opts_.lora.targets.has(target)) {
        la.lora_h[static_cast<size_t>(target)] = arena.alloc(t, {n, opts_.lora.rank});
      }
    }
  };
  recomputed_ = LayerActs{};
  if (opts_.num_layers > 0 && opts_.recompute == Recompute::full) alloc_layer(recomputed_, true);
  if (opts_.num_layers > 0 && opts_.recompute == Recompute::selective) {
    recomputed_.atty = arena.alloc(t, {b, s, c_local});
    recomputed_.probs = arena.alloc(f32, {b, heads_local_, s, stats_cols});
  }
  slots_.assign(opts_.slots, Slot{});
  for (Slot& slot : slots_) {
    slot.tokens = arena.alloc(DType::i32, {n});
    slot.targets = arena.alloc(DType::i32, {n});
    slot.positions = arena.alloc(DType::i32, {n});
    slot.positions_part = sp_ ? arena.alloc(DType::i32, {b * sp}) : slot.positions;
    slot.encoded = arena.alloc(t, {b, sp, c});
    if (!opts_.has_embedding || opts_.chunks > 1) slot.dinput = arena.alloc(t, {b, sp, c});
    for (int64_t l = 0; l < opts_.num_layers; ++l) {
      LayerActs la = recomputed_;
      switch (opts_.recompute) {
        case Recompute::none: alloc_layer(la, true); break;
        case Recompute::full: la.residual3 = arena.alloc(t, {b, sp, c}); break;
        case Recompute::selective: alloc_layer(la, false); break;  // probs, atty shared
      }
      slot.layers.push_back(la);
    }
  }
  if (opts_.has_head) {
    lnf_ = arena.alloc(t, {b, sp, c});
    lnf_full_ = full_of(lnf_);
    lnf_mean_ = arena.alloc(f32, {np});
    lnf_rstd_ = arena.alloc(f32, {np});
    logits_ = arena.alloc(t, {n, vocab_local_});
    ce_max_ = arena.alloc(f32, {n});
    ce_sumexp_ = arena.alloc(f32, {n});
    ce_target_ = arena.alloc(f32, {n});
    losses_ = arena.alloc(f32, {n});
    loss_record_ = arena.alloc(f32, {opts_.losses_per_read * n});
  }
  proj_out_ = arena.alloc(t, {b, s, c});
  proj_part_ = sp_ ? arena.alloc(t, {b, sp, c}) : proj_out_;
  emb_full_ = opts_.has_embedding ? (sp_ ? arena.alloc(t, {b, s, c}) : Tensor{}) : Tensor{};
  dresidual_ = arena.alloc(t, {b, sp, c});
  dres_full_ = full_of(dresidual_);
  dln_ = arena.alloc(t, {b, s, c});
  dln_part_ = sp_ ? arena.alloc(t, {b, sp, c}) : dln_;
  sp_stage_ = sp_ ? arena.alloc(t, {b * s * c}) : Tensor{};
  datty_ = arena.alloc(t, {b, s, c_local});
  dqkv_ = arena.alloc(t, {b, s, 3 * c_local});
  dfch_ = arena.alloc(t, {b, s, ffn_local_});
  dfch_gelu_ = arena.alloc(t, {b, s, ffn_local_});
  dprobs_ = arena.alloc(f32, {b, heads_local_, s, stats_cols});
  if (lora_) {
    // The widest map's output (qkv's 3C/tp, fc1's F/tp, proj's and fc2's C) and dx's widest
    // input (C, F/tp): B's output in the forward, dh A in the backward.
    lora_scratch_ = arena.alloc(t, {n * std::max({3 * c_local, ffn_local_, c})});
    lora_dh_ = arena.alloc(t, {n, opts_.lora.rank});
    // The widest input of a map: C (qkv, fc1), C/tp (proj), F/tp (fc2).
    if (opts_.lora_dropout > 0) lora_dropped_ = arena.alloc(t, {n * std::max(c, ffn_local_)});
    frozen_norm_w_ = arena.alloc(f32, {c});
    frozen_norm_b_ = arena.alloc(f32, {c});
  }
  for (Slot& slot : slots_) {
    for (size_t l = 0; l < slot.layers.size(); ++l) {
      LayerActs& la = slot.layers[l];
      la.input = l > 0 ? slot.layers[l - 1].residual3 : slot.encoded;
      la.proj_full = proj_out_;
      la.proj_part = proj_part_;
      if (lora_) {
        la.lora_rows = std::span<const LoraRows>(&every_row_, 1);
        la.lora_scratch = lora_scratch_;
        la.lora_dropped = lora_dropped_;
      }
    }
  }
}

Tensor GptModel::output(int slot) {
  Slot& s = slots_[slot];
  return s.layers.empty() ? s.encoded : s.layers.back().residual3;
}

void GptModel::head_forward(Slot& s, Tensor x) {
  head_logits_forward(layer_context(), {.wte = wte_, .lnf_w = lnf_w_, .lnf_b = lnf_b_},
                      {.lnf = lnf_, .lnf_full = lnf_full_, .lnf_mean = lnf_mean_,
                       .lnf_rstd = lnf_rstd_, .logits = logits_},
                      x, vocab_valid_);
  // Vocab-parallel cross-entropy: three tp all-reduces, no gathered logits.
  backend_.ce_local_max(ce_max_, logits_);
  tp_.all_reduce(ce_max_, ReduceOp::max);
  backend_.ce_local_sumexp(ce_sumexp_, logits_, ce_max_);
  backend_.ce_target_logit(ce_target_, logits_, s.targets, vocab_start_);
  tp_.all_reduce(ce_sumexp_, ReduceOp::sum);
  tp_.all_reduce(ce_target_, ReduceOp::sum);
  backend_.ce_loss(losses_, ce_max_, ce_sumexp_, ce_target_, s.targets);
}

int64_t GptModel::flat_end(std::initializer_list<int> params) const {
  int64_t end = 0;
  for (int p : params) {
    if (p >= 0) end = std::max(end, params_.info(p).flat_offset + params_.info(p).numel());
  }
  return end;
}

void GptModel::forward(int slot, int chunk, const int32_t* tokens, const int32_t* targets,
                       const int32_t* positions) {
  Slot& s = slots_[slot];
  s.chunk = chunk;
  s.packed = positions != nullptr;
  if (s.packed) {
    backend_.from_host(s.positions, positions);
    if (sp_) {  // this rank's part: positions [tp_rank x S/tp, +S/tp) of each sequence
      const int64_t b = opts_.micro_batch, seq = opts_.seq;
      host_positions_part_.resize(static_cast<size_t>(b * seq_part_));
      for (int64_t i = 0; i < b; ++i) {
        std::copy_n(positions + i * seq + tp_rank_ * seq_part_, seq_part_,
                    host_positions_part_.begin() + i * seq_part_);
      }
      backend_.from_host(s.positions_part, host_positions_part_.data());
    }
  }
  causal_.positions = s.packed ? s.positions : Tensor{};
  const int64_t base = chunk * opts_.num_layers;
  if (adapter_.dropout > 0) {  // this microbatch's masks, kept for its recomputation and backward
    const uint64_t microbatch = derive_seed(derive_seed(*dropout_seed_, static_cast<uint64_t>(chunk)),
                                            static_cast<uint64_t>(forwards_in_run_[static_cast<size_t>(chunk)]++));
    for (int64_t l = 0; l < opts_.num_layers; ++l) {
      s.layers[l].dropout_seed = derive_seed(microbatch, static_cast<uint64_t>(base + l));
    }
  }
  auto need = [&](std::initializer_list<int> params) {
    if (weights_needed_) weights_needed_(flat_end(params));
  };
  if (opts_.has_embedding && chunk == 0) {
    if (!lora_) need({wte_, wpe_});
    backend_.from_host(s.tokens, tokens);
    // Vocab-parallel embedding: each rank looks up its slice, zeros elsewhere, then all-reduce.
    Tensor full = sp_ ? emb_full_ : s.encoded;
    backend_.token_embedding_fwd(full, s.tokens, params_.weight(wte_), vocab_start_);
    region_.reduce(full, s.encoded);
    if (s.packed) {
      backend_.position_embedding_fwd(s.encoded, params_.weight(wpe_), s.positions_part);
    } else {  // this rank's part of the sequence starts at position tp_rank x S/tp
      backend_.position_embedding_fwd(
          s.encoded, params_.weight(wpe_).rows(sp_ ? tp_rank_ * seq_part_ : 0, seq_part_));
    }
  }
  for (int64_t l = 0; l < opts_.num_layers; ++l) {
    const LayerParams& p = layer_params_[base + l];
    if (weights_needed_) weights_needed_(layer_weights_end(p));
    transformer_layer_forward(layer_context(), p, causal_, s.layers[l]);
  }
  if (!opts_.has_head || chunk != opts_.chunks - 1) return;
  if (!lora_) need({wte_, lnf_w_, lnf_b_});
  backend_.from_host(s.targets, targets);
  head_forward(s, output(slot));
  if (losses_recorded_ == opts_.losses_per_read) {
    throw std::logic_error(fmt::format("GptModel: more than losses_per_read = {} microbatches "
                                       "before take_loss_sum()", opts_.losses_per_read));
  }
  const int64_t n = losses_.numel();
  backend_.copy(loss_record_.rows(losses_recorded_ * n, n), losses_);
  ++losses_recorded_;
}

void GptModel::begin_run(std::optional<uint64_t> dropout_seed) {
  dropout_seed_ = dropout_seed;
  forwards_in_run_.assign(static_cast<size_t>(opts_.chunks), 0);
  adapter_.dropout = lora_ && dropout_seed ? opts_.lora_dropout : 0.0f;
}

double GptModel::take_loss_sum() {
  if (losses_recorded_ == 0) return 0;
  const int64_t n = losses_.numel();
  backend_.to_host(host_losses_.data(), loss_record_.rows(0, losses_recorded_ * n));
  double sum = 0;
  for (int64_t k = 0; k < losses_recorded_; ++k) {
    double microbatch = 0;  // per microbatch first: the same sums as one read per microbatch
    for (int64_t i = 0; i < n; ++i) microbatch += host_losses_[static_cast<size_t>(k * n + i)];
    sum += microbatch;
  }
  losses_recorded_ = 0;
  return sum;
}

void GptModel::take_token_losses(std::vector<float>& out) {
  if (losses_recorded_ == 0) return;
  const int64_t n = losses_recorded_ * losses_.numel();
  backend_.to_host(host_losses_.data(), loss_record_.rows(0, n));
  out.insert(out.end(), host_losses_.begin(), host_losses_.begin() + n);
  losses_recorded_ = 0;
}

void GptModel::lora_backward(LoraTarget target, const LayerParams& p, Tensor dout, Tensor x,
                             Tensor dx, const LayerActs& a) {
  if (!lora_ || !p.lora.has(target)) return;
  const auto i = static_cast<size_t>(target);
  const int a_ix = p.lora.a[i], b_ix = p.lora.b[i];
  // dh = dout B, dB += dout^T h (h already holds scale x (x A^T)); then the scale's share.
  backend_.linear_bwd(lora_dh_, adapters_.grad(b_ix), Tensor{}, dout, a.lora_h[i],
                      adapters_.weight(b_ix));
  backend_.scale(lora_dh_, adapter_.scale);
  // dx += dh A, dA += dh^T x. Column-parallel: dh, dA and dx are partial sums over tp (dA's
  // by its ParamInfo, dx with the base map's input gradient). Row-parallel: all exact.
  const Tensor share = lora_scratch_.rows(0, dx.numel()).view({lora_dh_.dim(0), dx.numel() / lora_dh_.dim(0)});
  Tensor input = x;
  DropoutMask mask;
  if (adapter_.dropout > 0) {  // the forward's dropped-out input, and its mask on dx's share
    mask = lora_dropout_mask(adapter_, a.dropout_seed, target, region_, x.dim(-1));
    input = lora_dropped_.rows(0, x.numel()).view({share.dim(0), share.dim(1)});
    backend_.dropout(input, x.view({share.dim(0), share.dim(1)}), mask);
  }
  backend_.linear_bwd(share, adapters_.grad(a_ix), Tensor{}, lora_dh_, input, adapters_.weight(a_ix));
  if (adapter_.dropout > 0) backend_.dropout(share, share, mask);
  backend_.add(dx, dx, share);
}

void GptModel::block_backward(LayerActs& a, const LayerParams& p) {
  auto W = [&](int i) { return params_.weight(i); };
  auto G = [&](int i) { return params_.grad(i); };  // empty for LoRA's frozen base: no dW
  Tensor dres = dresidual_;  // holds d(residual3) on entry, d(input) on exit (this rank's part)
  // MLP: residual3 = residual2 + fc2(gelu(fc1(ln2(residual2))))
  region_.gather(dres, dres_full_);
  backend_.linear_bwd(dfch_gelu_, G(p.fc2_w), G(p.fc2_b), dres_full_, a.fch_gelu, W(p.fc2_w));
  lora_backward(LoraTarget::fc2, p, dres_full_, a.fch_gelu, dfch_gelu_, a);
  backend_.gelu_bwd(dfch_, dfch_gelu_, a.fch);
  backend_.linear_bwd(dln_, G(p.fc1_w), G(p.fc1_b), dfch_, a.ln2_full, W(p.fc1_w));
  lora_backward(LoraTarget::fc1, p, dfch_, a.ln2_full, dln_, a);
  region_.reduce(dln_, dln_part_);  // column-parallel input gradient
  backend_.layernorm_bwd(dres, norm_grad(p.ln2_w, frozen_norm_w_), norm_grad(p.ln2_b, frozen_norm_b_),
                         dln_part_, a.residual2, W(p.ln2_w), a.ln2_mean, a.ln2_rstd);
  // Attention: residual2 = input + proj(attn(qkv(ln1(input))))
  region_.gather(dres, dres_full_);
  backend_.linear_bwd(datty_, G(p.proj_w), G(p.proj_b), dres_full_, a.atty, W(p.proj_w));
  lora_backward(LoraTarget::proj, p, dres_full_, a.atty, datty_, a);
  backend_.attention_bwd(dqkv_, dprobs_, datty_, a.qkv, a.atty, a.probs, causal_.positions);
  backend_.linear_bwd(dln_, G(p.qkv_w), G(p.qkv_b), dqkv_, a.ln1_full, W(p.qkv_w));
  lora_backward(LoraTarget::qkv, p, dqkv_, a.ln1_full, dln_, a);
  region_.reduce(dln_, dln_part_);
  backend_.layernorm_bwd(dres, norm_grad(p.ln1_w, frozen_norm_w_), norm_grad(p.ln1_b, frozen_norm_b_),
                         dln_part_, a.input, W(p.ln1_w), a.ln1_mean, a.ln1_rstd);
}

void GptModel::head_backward(Slot& s, Tensor x, float loss_scale) {
  const int64_t n = opts_.micro_batch * opts_.seq, c = cfg_.d_model;
  // dlogits overwrite the logits in place.
  backend_.ce_bwd(logits_, logits_, ce_max_, ce_sumexp_, s.targets, vocab_start_, loss_scale);
  backend_.fill_columns(logits_, vocab_valid_, 0.0f);
  backend_.linear_bwd(dln_.view({n, c}), params_.grad(wte_), Tensor{}, logits_,
                      lnf_full_.view({n, c}), params_.weight(wte_));
  region_.reduce(dln_, dln_part_);  // the head is column-parallel over the vocabulary
  backend_.fill(dresidual_, 0.0f);
  backend_.layernorm_bwd(dresidual_, norm_grad(lnf_w_, frozen_norm_w_),
                         norm_grad(lnf_b_, frozen_norm_b_), dln_part_, x, params_.weight(lnf_w_),
                         lnf_mean_, lnf_rstd_);
}

void GptModel::backward(int slot, int chunk, float loss_scale) {
  Slot& s = slots_[slot];
  causal_.positions = s.packed ? s.positions : Tensor{};
  const int64_t base = chunk * opts_.num_layers;
  auto ready = [&](int param) {
    if (grads_ready_ && param >= 0 && !lora_) grads_ready_(params_.info(param).flat_offset);
  };
  // LoRA: a layer's adapters are final after its backward (the first of them at the lowest
  // offset: the store holds layer after layer).
  auto adapters_ready = [&](const LayerParams& p) {
    for (LoraTarget t : kLoraTargets) {
      if (!grads_ready_ || !p.lora.has(t)) continue;
      grads_ready_(adapters_.info(p.lora.a[static_cast<size_t>(t)]).flat_offset);
      return;
    }
  };
  if (opts_.has_head && chunk == opts_.chunks - 1) {
    head_backward(s, output(slot), loss_scale);
    ready(lnf_w_);
  }
  for (int64_t l = opts_.num_layers - 1; l >= 0; --l) {
    LayerActs& a = s.layers[l];
    if (opts_.recompute == Recompute::full) {
      // Rebuilds the shared tensors (and residual3) with the forward's own layer.
      transformer_layer_forward(layer_context(), layer_params_[base + l], causal_, a);
    } else if (opts_.recompute == Recompute::selective) {
      causal_.forward(backend_, a);
    }
    block_backward(a, layer_params_[base + l]);
    ready(layer_params_[base + l].ln1_w);  // the layer's first parameter
    if (lora_) adapters_ready(layer_params_[base + l]);
  }
  if (opts_.has_embedding && chunk == 0 && lora_) return;  // the frozen embeddings: nothing to do
  if (opts_.has_embedding && chunk == 0) {
    if (s.packed) {
      backend_.position_embedding_bwd(params_.grad(wpe_), dresidual_, s.positions_part);
    } else {
      backend_.position_embedding_bwd(
          params_.grad(wpe_).rows(sp_ ? tp_rank_ * seq_part_ : 0, seq_part_), dresidual_);
    }
    region_.gather(dresidual_, dres_full_);
    backend_.token_embedding_bwd(params_.grad(wte_), dres_full_, s.tokens, vocab_start_);
    ready(wpe_);
  } else {
    backend_.copy(s.dinput, dresidual_);  // sent to the previous stage from here
  }
}

}  // namespace jumbo
