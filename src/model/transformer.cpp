#include "jumbo/model/transformer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "jumbo/model/activations.h"
#include "jumbo/model/checkpoint_names.h"
#include "jumbo/model/lora.h"
#include "jumbo/model/rope.h"

namespace jumbo {

TransformerStage::TransformerStage(const ModelConfig& cfg, const StageOptions& opts, Backend& backend, Comm& tp)
    : cfg_(cfg), opts_(opts), spec_(model_spec(cfg, tp.size())), backend_(backend), tp_(tp),
      region_(backend, tp) {
  tp_rank_ = tp.rank();
  tp_size_ = tp.size();
  if (opts_.seq <= 0 || opts_.seq > cfg_.context) {
    throw std::logic_error(fmt::format("TransformerStage: seq {} outside (0, context {}]", opts_.seq,
                                       cfg_.context));
  }
  if (opts_.num_layers < 0) opts_.num_layers = cfg_.layers - opts_.first_layer;
  if (opts_.first_layer < 0 || opts_.chunks < 1 ||
      opts_.first_layer + (opts_.chunks - 1) * opts_.chunk_stride + opts_.num_layers > cfg_.layers ||
      opts_.slots < 1) {
    throw std::logic_error("TransformerStage: stage layers or slots out of range");
  }
  vocab_padded_ = cfg_.padded_vocab(tp_size_);
  vocab_local_ = vocab_padded_ / tp_size_;
  vocab_start_ = tp_rank_ * vocab_local_;
  vocab_valid_ = std::clamp<int64_t>(cfg_.vocab - vocab_start_, 0, vocab_local_);
  sp_ = opts_.sequence_parallel && tp_size_ > 1;
  if (sp_ && opts_.seq % tp_size_ != 0) {
    throw std::logic_error("TransformerStage: sequence parallelism needs seq divisible by tp");
  }
  seq_part_ = sp_ ? opts_.seq / tp_size_ : opts_.seq;
  causal_.kv_heads = spec_.kv_heads_local();
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
                                                   .width = cfg_.d_model, .stage = acts_.sp_stage});
  }
  host_losses_.resize(opts_.has_head ? opts_.losses_per_read * opts_.micro_batch * opts_.seq : 0);
  if (spec_.rope()) {  // constants, uploaded once
    backend_.from_host(acts_.rope_table, rope_table(cfg_, cfg_.context).data());
    std::vector<int32_t> positions(static_cast<size_t>(opts_.micro_batch * opts_.seq));
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int32_t>(i % opts_.seq);
    backend_.from_host(acts_.sequence_positions, positions.data());
  }
  if (sp_) host_positions_part_.resize(static_cast<size_t>(opts_.micro_batch * seq_part_));
}

KernelRequirements kernel_requirements(const ModelConfig& cfg, const StageOptions& opts) {
  return {.head_dim = cfg.head_dim(), .compute_dtype = opts.compute_dtype};
}

std::vector<ParamInfo> stage_params(const ModelConfig& cfg, const StageOptions& opts,
                                    int64_t tp_rank, int64_t tp_size) {
  std::vector<ParamInfo> out;
  const ModelSpec m = model_spec(cfg, tp_size);
  const int64_t c = m.d_model, f = m.ffn, l = m.layers;
  const int64_t qkv = m.qkv_width();
  const int64_t attn = m.attn_width(), attn_local = m.attn_local();
  const int64_t ffn_local = m.ffn_local();
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
  auto norm = [&](const std::string& name) {
    out.push_back(sequence_split(make_param(name + ".weight", {c}, {0}, {c}, ONE, 0, false, true)));
    if (m.norm_has_bias()) {
      out.push_back(sequence_split(make_param(name + ".bias", {c}, {0}, {c}, ZERO, 0, false, true)));
    }
  };
  // A column-parallel map's weight and bias, rows split by tp. `packed`: stored right after
  // the parameter before it (SwiGLU's up after its gate: one GEMM over both).
  auto column_weight = [&](const std::string& name, int64_t rows, bool packed) {
    const int64_t local = rows / tp_size;
    ParamInfo w = make_param(name + ".weight", {rows, c}, {tp_rank * local, 0}, {local, c}, N,
                             std, true, false);
    w.packed_with_previous = packed;
    out.push_back(w);
  };
  auto column_bias = [&](const std::string& name, int64_t rows, bool packed) {
    const int64_t local = rows / tp_size;
    ParamInfo b = make_param(name + ".bias", {rows}, {tp_rank * local}, {local}, ZERO, 0, false,
                             false);
    b.packed_with_previous = packed;
    out.push_back(b);
  };
  // The token embedding comes first in the flat buffer on the first stage, and when tied (as
  // the head) on the last: its gradient is final only after the embedding-group sum, so its
  // bucket is reduced last.
  if (opts.has_embedding || (opts.has_head && m.tied_embeddings)) {
    ParamInfo wte = make_param(kWordEmbedding, {vocab_padded, c}, {tp_rank * vocab_local, 0},
                               {vocab_local, c}, N, std, true, false);
    wte.tied_embedding = m.tied_embeddings;
    wte.pipeline_copy = !opts.has_embedding;
    wte.valid_rows = cfg.vocab;
    out.push_back(wte);
  }
  if (opts.has_embedding && m.learned_positions()) {
    out.push_back(sequence_split(make_param("embedding.position", {cfg.context, c}, {0, 0},
                                            {cfg.context, c}, N, std, true, true)));
  }
  for (int64_t chunk = 0; chunk < opts.chunks; ++chunk)
  for (int64_t i = opts.first_layer + chunk * opts.chunk_stride;
       i < opts.first_layer + chunk * opts.chunk_stride + num_layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    norm(p + "ln1");
    // Column-parallel QKV: rows in kv groups (each its query heads, key, value), so a tp
    // rank's groups are contiguous (backend.h's grouped layout; per head q, k, v for GPT).
    column_weight(p + "attn.qkv", qkv, false);
    if (m.qkv_bias) column_bias(p + "attn.qkv", qkv, false);
    if (m.qk_norm) {  // every tp rank norms its own heads: a partial sum of the gradient
      for (const char* name : {"attn.q_norm.weight", "attn.k_norm.weight"}) {
        ParamInfo w = make_param(p + name, {m.head_dim}, {0}, {m.head_dim}, ONE, 0, false, true);
        w.tp_partial_grad = tp_size > 1;
        out.push_back(w);
      }
    }
    // Row-parallel output projection: columns split.
    out.push_back(make_param(p + "attn.proj.weight", {c, attn}, {0, tp_rank * attn_local},
                             {c, attn_local}, N, resid_std, true, false));
    if (m.linear_bias) out.push_back(make_param(p + "attn.proj.bias", {c}, {0}, {c}, ZERO, 0, false, true));
    norm(p + "ln2");
    if (m.swiglu()) {  // gate and up side by side: one [2F/tp, C] GEMM, then silu(gate) * up
      column_weight(p + "mlp.gate", f, false);
      column_weight(p + "mlp.up", f, true);
      if (m.linear_bias) {
        column_bias(p + "mlp.gate", f, false);
        column_bias(p + "mlp.up", f, true);
      }
    } else {
      column_weight(p + "mlp.fc1", f, false);
      if (m.linear_bias) column_bias(p + "mlp.fc1", f, false);
    }
    out.push_back(make_param(p + "mlp.fc2.weight", {c, f}, {0, tp_rank * ffn_local},
                             {c, ffn_local}, N, resid_std, true, false));
    if (m.linear_bias) out.push_back(make_param(p + "mlp.fc2.bias", {c}, {0}, {c}, ZERO, 0, false, true));
  }
  if (opts.has_head) {
    norm("final_norm");
    if (!m.tied_embeddings) {  // the output head: vocab-parallel like the embedding
      ParamInfo head = make_param(kUntiedHead, {vocab_padded, c}, {tp_rank * vocab_local, 0},
                                  {vocab_local, c}, N, std, true, false);
      head.valid_rows = cfg.vocab;
      out.push_back(head);
    }
  }
  return out;
}

StageParamIndex stage_param_index(const ModelConfig& cfg, const StageOptions& opts) {
  // stage_params' order, by the spec's pieces.
  const ModelSpec m = model_spec(cfg);
  StageParamIndex ix;
  int next = 0;
  auto take = [&](bool present) { return present ? next++ : -1; };
  ix.wte = take(opts.has_embedding || (opts.has_head && m.tied_embeddings));
  ix.wpe = take(opts.has_embedding && m.learned_positions());
  const int64_t layers = opts.chunks * opts.num_layers;
  for (int64_t i = 0; i < layers; ++i) {
    LayerParams lp{};
    lp.ln1_w = take(true);
    lp.ln1_b = take(m.norm_has_bias());
    lp.qkv_w = take(true);
    lp.qkv_b = take(m.qkv_bias);
    lp.q_norm_w = take(m.qk_norm);
    lp.k_norm_w = take(m.qk_norm);
    lp.proj_w = take(true);
    lp.proj_b = take(m.linear_bias);
    lp.ln2_w = take(true);
    lp.ln2_b = take(m.norm_has_bias());
    lp.fc1_w = take(true);
    lp.up_w = take(m.swiglu());
    lp.fc1_b = take(m.linear_bias);
    lp.up_b = take(m.swiglu() && m.linear_bias);
    lp.fc2_w = take(true);
    lp.fc2_b = take(m.linear_bias);
    ix.layers.push_back(lp);
  }
  if (opts.has_head) {
    ix.lnf_w = take(true);
    ix.lnf_b = take(m.norm_has_bias());
    ix.head = m.tied_embeddings ? ix.wte : take(true);
  }
  return ix;
}

void TransformerStage::register_params() {
  for (ParamInfo& p : stage_params(cfg_, opts_, tp_rank_, tp_size_)) params_.add(std::move(p));
  const StageParamIndex ix = stage_param_index(cfg_, opts_);
  wte_ = ix.wte;
  wpe_ = ix.wpe;
  lnf_w_ = ix.lnf_w;
  lnf_b_ = ix.lnf_b;
  head_ = ix.head;
  layer_params_ = ix.layers;
  if (!lora_) return;
  for (ParamInfo& p : lora_stage_params(cfg_, opts_, tp_rank_, tp_size_)) adapters_.add(std::move(p));
  const std::vector<LoraLayerParams> adapters = lora_layer_index(opts_);
  for (size_t l = 0; l < layer_params_.size(); ++l) layer_params_[l].lora = adapters[l];
}

int64_t TransformerStage::layer_weights_end(const LayerParams& p) const {
  if (!lora_) {
    return flat_end({p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.q_norm_w, p.k_norm_w, p.proj_w,
                     p.proj_b, p.ln2_w, p.ln2_b, p.fc1_w, p.fc1_b, p.up_w, p.up_b, p.fc2_w, p.fc2_b});
  }
  int64_t end = 0;
  for (LoraTarget t : kLoraTargets) {
    if (!p.lora.has(t)) continue;
    const ParamInfo& b = adapters_.info(p.lora.b[static_cast<size_t>(t)]);
    end = std::max(end, b.flat_offset + b.numel());
  }
  return end;
}

void TransformerStage::layout_activations(Arena& arena) {
  // The stage's tensors as model/activations.h lays them out (what the planner counts).
  StageActivations a = layout_stage_activations(arena, cfg_, opts_, tp_size_,
                                                backend_.attention_stats_cols(opts_.seq));
  slots_.assign(opts_.slots, Slot{});
  for (size_t i = 0; i < slots_.size(); ++i) {
    static_cast<SlotActivations&>(slots_[i]) = std::move(a.slots[i]);
  }
  a.slots.clear();
  acts_ = std::move(a);
  for (Slot& slot : slots_) {
    for (size_t l = 0; l < slot.layers.size(); ++l) {
      LayerActs& la = slot.layers[l];
      la.input = l > 0 ? slot.layers[l - 1].residual3 : slot.encoded;
      la.proj_full = acts_.proj_out;
      la.proj_part = acts_.proj_part;
      if (lora_) {
        la.lora_rows = std::span<const LoraRows>(&every_row_, 1);
        la.lora_scratch = acts_.lora_scratch;
        la.lora_dropped = acts_.lora_dropped;
      }
    }
  }
}

Tensor TransformerStage::output(int slot) {
  Slot& s = slots_[slot];
  return s.layers.empty() ? s.encoded : s.layers.back().residual3;
}

void TransformerStage::head_forward(Slot& s, Tensor x) {
  head_logits_forward(layer_context(), {.head = head_, .lnf_w = lnf_w_, .lnf_b = lnf_b_},
                      {.lnf = acts_.lnf, .lnf_full = acts_.lnf_full, .lnf_mean = acts_.lnf_mean,
                       .lnf_rstd = acts_.lnf_rstd, .logits = acts_.logits},
                      x, vocab_valid_);
  // Vocab-parallel cross-entropy: three tp all-reduces, no gathered logits.
  backend_.ce_local_max(acts_.ce_max, acts_.logits);
  tp_.all_reduce(acts_.ce_max, ReduceOp::max);
  backend_.ce_local_sumexp(acts_.ce_sumexp, acts_.logits, acts_.ce_max);
  backend_.ce_target_logit(acts_.ce_target, acts_.logits, s.targets, vocab_start_);
  tp_.all_reduce(acts_.ce_sumexp, ReduceOp::sum);
  tp_.all_reduce(acts_.ce_target, ReduceOp::sum);
  backend_.ce_loss(acts_.losses, acts_.ce_max, acts_.ce_sumexp, acts_.ce_target, s.targets);
}

int64_t TransformerStage::flat_end(std::initializer_list<int> params) const {
  int64_t end = 0;
  for (int p : params) {
    if (p >= 0) end = std::max(end, params_.info(p).flat_offset + params_.info(p).numel());
  }
  return end;
}

void TransformerStage::forward(int slot, int chunk, const int32_t* tokens, const int32_t* targets,
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
    if (!lora_) need({wte_, wpe_});  // wpe_ -1 with RoPE
    backend_.from_host(s.tokens, tokens);
    // Vocab-parallel embedding: each rank looks up its slice, zeros elsewhere, then all-reduce.
    Tensor full = sp_ ? acts_.emb_full : s.encoded;
    backend_.token_embedding_fwd(full, s.tokens, params_.weight(wte_), vocab_start_);
    region_.reduce(full, s.encoded);
    if (spec_.learned_positions() && s.packed) {
      backend_.position_embedding_fwd(s.encoded, params_.weight(wpe_), s.positions_part);
    } else if (spec_.learned_positions()) {  // this rank's part starts at tp_rank x S/tp
      backend_.position_embedding_fwd(
          s.encoded, params_.weight(wpe_).rows(sp_ ? tp_rank_ * seq_part_ : 0, seq_part_));
    }  // RoPE: positions enter in each layer's attention
  }
  for (int64_t l = 0; l < opts_.num_layers; ++l) {
    const LayerParams& p = layer_params_[base + l];
    if (weights_needed_) weights_needed_(layer_weights_end(p));
    transformer_layer_forward(layer_context(rope_positions(s)), p, causal_, s.layers[l]);
  }
  if (!opts_.has_head || chunk != opts_.chunks - 1) return;
  if (!lora_) need({head_, lnf_w_, lnf_b_});
  backend_.from_host(s.targets, targets);
  head_forward(s, output(slot));
  if (losses_recorded_ == opts_.losses_per_read) {
    throw std::logic_error(fmt::format("TransformerStage: more than losses_per_read = {} microbatches "
                                       "before take_loss_sum()", opts_.losses_per_read));
  }
  const int64_t n = acts_.losses.numel();
  backend_.copy(acts_.loss_record.rows(losses_recorded_ * n, n), acts_.losses);
  ++losses_recorded_;
}

void TransformerStage::begin_run(std::optional<uint64_t> dropout_seed) {
  dropout_seed_ = dropout_seed;
  forwards_in_run_.assign(static_cast<size_t>(opts_.chunks), 0);
  adapter_.dropout = lora_ && dropout_seed ? opts_.lora_dropout : 0.0f;
}

double TransformerStage::take_loss_sum() {
  if (losses_recorded_ == 0) return 0;
  const int64_t n = acts_.losses.numel();
  backend_.to_host(host_losses_.data(), acts_.loss_record.rows(0, losses_recorded_ * n));
  double sum = 0;
  for (int64_t k = 0; k < losses_recorded_; ++k) {
    double microbatch = 0;  // per microbatch first: the same sums as one read per microbatch
    for (int64_t i = 0; i < n; ++i) microbatch += host_losses_[static_cast<size_t>(k * n + i)];
    sum += microbatch;
  }
  losses_recorded_ = 0;
  return sum;
}

void TransformerStage::take_token_losses(std::vector<float>& out) {
  if (losses_recorded_ == 0) return;
  const int64_t n = losses_recorded_ * acts_.losses.numel();
  backend_.to_host(host_losses_.data(), acts_.loss_record.rows(0, n));
  out.insert(out.end(), host_losses_.begin(), host_losses_.begin() + n);
  losses_recorded_ = 0;
}

void TransformerStage::lora_backward(LoraTarget target, const LayerParams& p, Tensor dout, Tensor x,
                             Tensor dx, const LayerActs& a) {
  if (!lora_ || !p.lora.has(target)) return;
  const auto i = static_cast<size_t>(target);
  const int a_ix = p.lora.a[i], b_ix = p.lora.b[i];
  if (const ColumnBlocks part = lora_output_blocks(spec_, target); part.block > 0) {
    // The map's part of its packed output's gradient, contiguous: what B's products read.
    const int64_t rows = dout.numel() / dout.dim(-1), width = adapters_.info(b_ix).slice.shape[0];
    const Tensor narrow = acts_.lora_dout.rows(0, rows * width).view({rows, width});
    backend_.copy_from_column_blocks(narrow, dout.view({rows, dout.dim(-1)}), part);
    dout = narrow;
  }
  // dh = dout B, dB += dout^T h (h already holds scale x (x A^T)); then the scale's share.
  backend_.linear_bwd(acts_.lora_dh, adapters_.grad(b_ix), Tensor{}, dout, a.lora_h[i],
                      adapters_.weight(b_ix));
  backend_.scale(acts_.lora_dh, adapter_.scale);
  // dx += dh A, dA += dh^T x. Column-parallel: dh, dA and dx are partial sums over tp (dA's
  // by its ParamInfo, dx with the base map's input gradient). Row-parallel: all exact.
  const Tensor share = acts_.lora_scratch.rows(0, dx.numel()).view({acts_.lora_dh.dim(0), dx.numel() / acts_.lora_dh.dim(0)});
  Tensor input = x;
  DropoutMask mask;
  if (adapter_.dropout > 0) {  // the forward's dropped-out input, and its mask on dx's share
    mask = lora_dropout_mask(adapter_, a.dropout_seed, target, region_, x.dim(-1));
    input = acts_.lora_dropped.rows(0, x.numel()).view({share.dim(0), share.dim(1)});
    backend_.dropout(input, x.view({share.dim(0), share.dim(1)}), mask);
  }
  backend_.linear_bwd(share, adapters_.grad(a_ix), Tensor{}, acts_.lora_dh, input, adapters_.weight(a_ix));
  if (adapter_.dropout > 0) backend_.dropout(share, share, mask);
  backend_.add(dx, dx, share);
}

void TransformerStage::norm_backward(Tensor dx, int weight, int bias, Tensor dout, Tensor x, Tensor mean,
                             Tensor rstd) {
  if (spec_.norm == Norm::rmsnorm) {
    backend_.rmsnorm_bwd(dx, norm_grad(weight, acts_.frozen_norm_w), dout, x, params_.weight(weight),
                         rstd);
  } else {
    backend_.layernorm_bwd(dx, norm_grad(weight, acts_.frozen_norm_w), norm_grad(bias, acts_.frozen_norm_b),
                           dout, x, params_.weight(weight), mean, rstd);
  }
}

void TransformerStage::block_backward(LayerActs& a, const LayerParams& p, Tensor rope_positions) {
  auto W = [&](int i) { return params_.weight(i); };
  // Empty for LoRA's frozen base (no dW) and for a bias the spec has not.
  auto G = [&](int i) { return i >= 0 ? params_.grad(i) : Tensor{}; };
  Tensor dres = acts_.dresidual;  // holds d(residual3) on entry, d(input) on exit (this rank's part)
  // MLP: residual3 = residual2 + fc2(act(fc1(ln2(residual2))))
  region_.gather(dres, acts_.dres_full);
  backend_.linear_bwd(acts_.dfch_act, G(p.fc2_w), G(p.fc2_b), acts_.dres_full, a.fch_act, W(p.fc2_w));
  lora_backward(LoraTarget::fc2, p, acts_.dres_full, a.fch_act, acts_.dfch_act, a);
  if (spec_.swiglu()) {  // the packed gate and up: one GEMM's gradients
    backend_.swiglu_bwd(acts_.dfch, acts_.dfch_act, a.fch);
    const Tensor dw = lora_ ? Tensor{} : params_.joined_grads(p.fc1_w, p.up_w);
    const Tensor db = lora_ || p.fc1_b < 0 ? Tensor{} : params_.joined_grads(p.fc1_b, p.up_b);
    backend_.linear_bwd(acts_.dln, dw, db, acts_.dfch, a.ln2_full, params_.joined_weights(p.fc1_w, p.up_w));
  } else {
    backend_.gelu_bwd(acts_.dfch, acts_.dfch_act, a.fch);
    backend_.linear_bwd(acts_.dln, G(p.fc1_w), G(p.fc1_b), acts_.dfch, a.ln2_full, W(p.fc1_w));
  }
  for (LoraTarget map : {LoraTarget::fc1, LoraTarget::gate, LoraTarget::up}) {
    lora_backward(map, p, acts_.dfch, a.ln2_full, acts_.dln, a);
  }
  region_.reduce(acts_.dln, acts_.dln_part);  // column-parallel input gradient
  norm_backward(dres, p.ln2_w, p.ln2_b, acts_.dln_part, a.residual2, a.ln2_mean, a.ln2_rstd);
  // Attention: residual2 = input + proj(attn(rope?(qkv(ln1(input)))))
  region_.gather(dres, acts_.dres_full);
  backend_.linear_bwd(acts_.datty, G(p.proj_w), G(p.proj_b), acts_.dres_full, a.atty, W(p.proj_w));
  lora_backward(LoraTarget::proj, p, acts_.dres_full, a.atty, acts_.datty, a);
  backend_.attention_bwd(acts_.dqkv, acts_.dprobs, acts_.datty, a.qkv, a.atty, a.probs, causal_.kv_heads,
                         causal_.positions);
  if (spec_.rope()) {  // back through the rotation: d(before) = R^T d(after)
    backend_.rope(acts_.dqkv, acts_.rope_table, rope_positions, spec_.kv_heads_local(), RopeDirection::inverse);
  }
  if (spec_.qk_norm) {  // in place: d(qkv_raw) from d(qkv)
    backend_.qk_norm_bwd(acts_.dqkv, lora_ ? Tensor{} : G(p.q_norm_w), lora_ ? Tensor{} : G(p.k_norm_w),
                         acts_.dqkv, a.qkv_raw, W(p.q_norm_w), W(p.k_norm_w), a.qk_rstd,
                         spec_.kv_heads_local());
  }
  backend_.linear_bwd(acts_.dln, G(p.qkv_w), G(p.qkv_b), acts_.dqkv, a.ln1_full, W(p.qkv_w));
  for (LoraTarget map : {LoraTarget::qkv, LoraTarget::q, LoraTarget::k, LoraTarget::v}) {
    lora_backward(map, p, acts_.dqkv, a.ln1_full, acts_.dln, a);
  }
  region_.reduce(acts_.dln, acts_.dln_part);
  norm_backward(dres, p.ln1_w, p.ln1_b, acts_.dln_part, a.input, a.ln1_mean, a.ln1_rstd);
}

void TransformerStage::head_backward(Slot& s, Tensor x, float loss_scale) {
  const int64_t n = opts_.micro_batch * opts_.seq, c = cfg_.d_model;
  // dlogits overwrite the logits in place.
  backend_.ce_bwd(acts_.logits, acts_.logits, acts_.ce_max, acts_.ce_sumexp, s.targets, vocab_start_, loss_scale);
  backend_.fill_columns(acts_.logits, vocab_valid_, 0.0f);
  backend_.linear_bwd(acts_.dln.view({n, c}), lora_ ? Tensor{} : params_.grad(head_), Tensor{}, acts_.logits,
                      acts_.lnf_full.view({n, c}), params_.weight(head_));
  region_.reduce(acts_.dln, acts_.dln_part);  // the head is column-parallel over the vocabulary
  backend_.fill(acts_.dresidual, 0.0f);
  norm_backward(acts_.dresidual, lnf_w_, lnf_b_, acts_.dln_part, x, acts_.lnf_mean, acts_.lnf_rstd);
}

void TransformerStage::backward(int slot, int chunk, float loss_scale) {
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
      transformer_layer_forward(layer_context(rope_positions(s)), layer_params_[base + l], causal_, a);
    } else if (opts_.recompute == Recompute::selective) {
      causal_.forward(backend_, a);
    }
    block_backward(a, layer_params_[base + l], rope_positions(s));
    ready(layer_params_[base + l].ln1_w);  // the layer's first parameter
    if (lora_) adapters_ready(layer_params_[base + l]);
  }
  if (opts_.has_embedding && chunk == 0 && lora_) return;  // the frozen embeddings: nothing to do
  if (opts_.has_embedding && chunk == 0) {
    if (spec_.learned_positions() && s.packed) {
      backend_.position_embedding_bwd(params_.grad(wpe_), acts_.dresidual, s.positions_part);
    } else if (spec_.learned_positions()) {
      backend_.position_embedding_bwd(
          params_.grad(wpe_).rows(sp_ ? tp_rank_ * seq_part_ : 0, seq_part_), acts_.dresidual);
    }
    region_.gather(acts_.dresidual, acts_.dres_full);
    backend_.token_embedding_bwd(params_.grad(wte_), acts_.dres_full, s.tokens, vocab_start_);
    if (wpe_ >= 0) ready(wpe_);  // RoPE: no position table; the embedding is never reported
  } else {
    backend_.copy(s.dinput, acts_.dresidual);  // sent to the previous stage from here
  }
}

}  // namespace jumbo
