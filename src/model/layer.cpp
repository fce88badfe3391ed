#include "jumbo/model/layer.h"

#include <cmath>
#include <stdexcept>

namespace jumbo {

TensorParallelRegion::TensorParallelRegion(Backend& backend, Comm& tp, const SequenceSplit& split)
    : backend_(&backend), tp_(&tp), split_(tp.size() > 1), seq_(split) {
  if (split_ && (seq_.seq % tp.size() != 0 || seq_.stage.numel() != seq_.batch * seq_.seq * seq_.width)) {
    throw std::logic_error("TensorParallelRegion: seq divisible by tp and a batch x seq x width stage");
  }
  seq_part_ = seq_.seq / tp.size();
}

void TensorParallelRegion::reduce(Tensor full, Tensor part) {
  if (!split_) {
    tp_->all_reduce(full, ReduceOp::sum);
    return;
  }
  // [B, S, C] -> [tp, B, S/tp, C], so each rank's part is one block of the reduce-scatter.
  const int64_t b = seq_.batch, s = seq_.seq, c = seq_.width;
  Tensor rows = full.view({b * s, c}), stage = seq_.stage.view({b * s, c});
  for (int64_t r = 0; r < tp_->size(); ++r) {
    for (int64_t i = 0; i < b; ++i) {
      backend_->copy(stage.rows((r * b + i) * seq_part_, seq_part_),
                     rows.rows(i * s + r * seq_part_, seq_part_));
    }
  }
  tp_->reduce_scatter(seq_.stage, part.view({b * seq_part_ * c}));
}

void TensorParallelRegion::gather(Tensor part, Tensor full) {
  if (!split_) return;
  const int64_t b = seq_.batch, s = seq_.seq, c = seq_.width;
  tp_->all_gather(part.view({b * seq_part_ * c}), seq_.stage);
  Tensor rows = full.view({b * s, c}), stage = seq_.stage.view({b * s, c});
  for (int64_t r = 0; r < tp_->size(); ++r) {
    for (int64_t i = 0; i < b; ++i) {
      backend_->copy(rows.rows(i * s + r * seq_part_, seq_part_),
                     stage.rows((r * b + i) * seq_part_, seq_part_));
    }
  }
}

bool CausalAttention::forward(Backend& backend, LayerTensors& t) {
  backend.attention_fwd(t.atty, t.probs, t.qkv, kv_heads, positions);
  return true;
}

bool KvCacheAttention::forward(Backend& backend, LayerTensors& t) {
  backend.attention_kv_cache(t.atty, t.qkv, k_cache_, v_cache_, rows_);
  if (keep_.count < 0) return true;
  // Every row's key and value is in the cache now; the kept rows are gathered (the position
  // table lookup, by row index) and the rest of the layer runs on them alone.
  const int64_t n = keep_.count;
  if (n == 0) return false;
  Tensor rows = keep_.rows.rows(0, n);
  backend.token_embedding_fwd(keep_.input.rows(0, n), rows, t.input, 0);
  backend.token_embedding_fwd(keep_.atty.rows(0, n), rows, t.atty, 0);
  t.input = t.residual2 = t.residual3 = keep_.input.rows(0, n);
  t.atty = keep_.atty.rows(0, n);
  t.lora_rows = keep_.lora_rows;
  for (Tensor* later : {&t.ln2, &t.ln2_full, &t.ln2_mean, &t.ln2_rstd, &t.fch, &t.fch_act,
                        &t.proj_full, &t.proj_part}) {
    if (!later->empty()) *later = later->rows(0, n);  // RMSNorm keeps no mean
  }
  return true;
}

namespace {

// The leading rows x cols of a row-major matrix's memory, as a [rows, cols] matrix: a pool
// slot's A and B for an adapter of lower rank than the slot's, and h's rows for it.
Tensor leading(Tensor m, int64_t rows, int64_t cols) {
  if (m.dim(0) == rows && m.dim(-1) == cols) return m;
  return m.view({m.numel()}).rows(0, rows * cols).view({rows, cols});
}
// A tensor's rows as a matrix [rows, last dim].
Tensor as_matrix(Tensor t) { return t.view({t.numel() / t.dim(-1), t.dim(-1)}); }

}  // namespace

Tensor LoraAdapter::a(int param) const {
  const Tensor m = store->weight(param);
  return leading(m, rank, m.dim(1));
}
Tensor LoraAdapter::b(int param) const {
  const Tensor m = store->weight(param);
  return leading(m, m.dim(0), rank);
}

DropoutMask lora_dropout_mask(const LoraAdapter& adapter, uint64_t layer_seed, LoraTarget target,
                              const TensorParallelRegion& tp, int64_t in_local) {
  const bool row_parallel = target == LoraTarget::proj || target == LoraTarget::fc2;
  return {.seed = derive_seed(layer_seed, static_cast<uint64_t>(target)),
          .p = adapter.dropout,
          .col_offset = row_parallel ? tp.rank() * in_local : 0,
          .cols_total = row_parallel ? tp.size() * in_local : in_local};
}

ColumnBlocks lora_output_blocks(const ModelSpec& spec, LoraTarget target) {
  const int64_t d = spec.head_dim, r = spec.heads / spec.kv_heads, period = (r + 2) * d;
  const int64_t f = spec.ffn_local();
  switch (target) {
    case LoraTarget::q: return {.block = r * d, .first = 0, .period = period};
    case LoraTarget::k: return {.block = d, .first = r * d, .period = period};
    case LoraTarget::v: return {.block = d, .first = (r + 1) * d, .period = period};
    case LoraTarget::gate: return {.block = f, .first = 0, .period = f};
    case LoraTarget::up: return {.block = f, .first = f, .period = f};
    default: return {};
  }
}

void lora_forward(const LayerContext& ctx, const LayerTensors& t, LoraTarget target,
                  const LoraLayerParams& p, Tensor x, Tensor out, Tensor h) {
  const auto i = static_cast<size_t>(target);
  if (t.lora_rows.empty() || !p.has(target)) return;
  Backend& be = ctx.backend;
  const bool row_parallel = target == LoraTarget::proj || target == LoraTarget::fc2;
  const Tensor xm = as_matrix(x), outm = as_matrix(out);
  for (const LoraRows& range : t.lora_rows) {
    const LoraAdapter& ad = *range.adapter;
    if (range.count == 0 || !ad.targets.has(target)) continue;
    const int64_t r = ad.rank, n = range.count;
    const Tensor a = ad.a(p.a[i]), b = ad.b(p.b[i]);
    const Tensor hr = leading(h.rows(range.begin, n), n, r);
    Tensor xs = xm.rows(range.begin, n);
    if (ad.dropout > 0) {  // training: x A^T of the dropped-out input
      const Tensor dropped = leading(t.lora_dropped, n, xs.dim(1));
      be.dropout(dropped, xs, lora_dropout_mask(ad, t.dropout_seed, target, ctx.tp, xs.dim(1)));
      xs = dropped;
    }
    be.linear_fwd(hr, xs, a, Tensor{});
    if (row_parallel) ctx.tp.all_reduce(hr);
    be.scale(hr, ad.scale);
    if (row_parallel && !ctx.tp.counts_row_parallel_terms()) continue;
    const Tensor added = leading(t.lora_scratch, n, b.dim(0));
    be.linear_fwd(added, hr, b, Tensor{});
    const Tensor target_rows = outm.rows(range.begin, n);
    if (const ColumnBlocks part = lora_output_blocks(ctx.spec, target); part.block > 0) {
      be.add_to_column_blocks(target_rows, added, part);  // its part of a packed output
    } else {
      be.add(target_rows, target_rows, added);
    }
  }
}

void norm_forward(const LayerContext& ctx, int weight, int bias, Tensor out, Tensor mean,
                  Tensor rstd, Tensor x) {
  if (ctx.spec.norm == Norm::rmsnorm) {
    ctx.backend.rmsnorm_fwd(out, rstd, x, ctx.weight(weight), ctx.spec.norm_eps);
  } else {
    ctx.backend.layernorm_fwd(out, mean, rstd, x, ctx.weight(weight), ctx.weight(bias),
                              ctx.spec.norm_eps);
  }
}

void transformer_layer_forward(const LayerContext& ctx, const LayerParams& p,
                               CoreAttention& attention, LayerTensors t) {
  Backend& be = ctx.backend;
  TensorParallelRegion& tp = ctx.tp;
  auto W = [&](int i) { return ctx.weight(i); };
  // Attention: residual2 = input + proj(attn(rope?(qkv(ln1(input)))))
  norm_forward(ctx, p.ln1_w, p.ln1_b, t.ln1, t.ln1_mean, t.ln1_rstd, t.input);
  tp.gather(t.ln1, t.ln1_full);
  // With qk-norm the map writes qkv_raw, and the norm of its q and k heads qkv.
  const Tensor qkv_out = ctx.spec.qk_norm ? t.qkv_raw : t.qkv;
  be.linear_fwd(qkv_out, t.ln1_full, W(p.qkv_w), W(p.qkv_b));
  for (LoraTarget map : {LoraTarget::qkv, LoraTarget::q, LoraTarget::k, LoraTarget::v}) {
    lora_forward(ctx, t, map, p.lora, t.ln1_full, qkv_out, t.lora_h[static_cast<size_t>(map)]);
  }
  if (ctx.spec.qk_norm) {
    be.qk_norm_fwd(t.qkv, t.qk_rstd, t.qkv_raw, W(p.q_norm_w), W(p.k_norm_w),
                   ctx.spec.kv_heads_local(), ctx.spec.norm_eps);
  }
  if (ctx.spec.rope()) {
    be.rope(t.qkv, ctx.rope_table, ctx.rope_positions, ctx.spec.kv_heads_local(),
            RopeDirection::forward);
  }
  if (!attention.forward(be, t)) return;
  be.linear_fwd(t.proj_full, t.atty, W(p.proj_w), tp.row_parallel_bias(W(p.proj_b)));
  lora_forward(ctx, t, LoraTarget::proj, p.lora, t.atty, t.proj_full,
               t.lora_h[static_cast<size_t>(LoraTarget::proj)]);
  tp.reduce(t.proj_full, t.proj_part);
  be.add(t.residual2, t.input, t.proj_part);
  // MLP: residual3 = residual2 + fc2(act(fc1(ln2(residual2))))
  norm_forward(ctx, p.ln2_w, p.ln2_b, t.ln2, t.ln2_mean, t.ln2_rstd, t.residual2);
  tp.gather(t.ln2, t.ln2_full);
  if (ctx.spec.swiglu()) {  // gate and up in one GEMM over the packed pair
    const Tensor bias = p.fc1_b >= 0 ? ctx.params.joined_weights(p.fc1_b, p.up_b) : Tensor{};
    be.linear_fwd(t.fch, t.ln2_full, ctx.params.joined_weights(p.fc1_w, p.up_w), bias);
    for (LoraTarget map : {LoraTarget::gate, LoraTarget::up}) {
      lora_forward(ctx, t, map, p.lora, t.ln2_full, t.fch, t.lora_h[static_cast<size_t>(map)]);
    }
    be.swiglu_fwd(t.fch_act, t.fch);
  } else {
    bool fc1_adapted = false;  // the adapter joins before the GELU
    for (const LoraRows& range : t.lora_rows) fc1_adapted |= range.adapter->targets.has(LoraTarget::fc1);
    if (fc1_adapted && p.lora.has(LoraTarget::fc1)) {
      be.linear_fwd(t.fch, t.ln2_full, W(p.fc1_w), W(p.fc1_b));
      lora_forward(ctx, t, LoraTarget::fc1, p.lora, t.ln2_full, t.fch,
                   t.lora_h[static_cast<size_t>(LoraTarget::fc1)]);
      be.gelu_fwd(t.fch_act, t.fch);
    } else {
      be.linear_gelu_fwd(t.fch_act, t.fch, t.ln2_full, W(p.fc1_w), W(p.fc1_b));
    }
  }
  be.linear_fwd(t.proj_full, t.fch_act, W(p.fc2_w), tp.row_parallel_bias(W(p.fc2_b)));
  lora_forward(ctx, t, LoraTarget::fc2, p.lora, t.fch_act, t.proj_full,
               t.lora_h[static_cast<size_t>(LoraTarget::fc2)]);
  tp.reduce(t.proj_full, t.proj_part);
  be.add(t.residual3, t.residual2, t.proj_part);
}

void head_logits_forward(const LayerContext& ctx, const HeadParams& p, const HeadTensors& t,
                         Tensor x, int64_t vocab_valid) {
  Backend& be = ctx.backend;
  norm_forward(ctx, p.lnf_w, p.lnf_b, t.lnf, t.lnf_mean, t.lnf_rstd, x);
  ctx.tp.gather(t.lnf, t.lnf_full);
  // This rank's vocabulary slice only (vocab-parallel, no gathered logits).
  be.linear_fwd(t.logits, t.lnf_full.view({t.logits.dim(0), t.lnf_full.dim(-1)}),
                ctx.params.weight(p.head), Tensor{});
  be.fill_columns(t.logits, vocab_valid, -INFINITY);
}

}  // namespace jumbo
