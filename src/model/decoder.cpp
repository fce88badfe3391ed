#include "jumbo/model/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "jumbo/model/lora.h"
#include "jumbo/model/rope.h"

namespace jumbo {

TransformerDecoder::TransformerDecoder(const ModelConfig& cfg, const StageOptions& stage, const DecodeShape& shape,
                       Backend& backend, Comm& tp)
    : cfg_(cfg), opts_(stage), spec_(model_spec(cfg, tp.size())), shape_(shape), backend_(backend),
      tp_(tp) {
  if (shape_.cache_positions <= 0) shape_.cache_positions = cfg_.context;
  if (opts_.num_layers < 0) opts_.num_layers = cfg_.layers - opts_.first_layer;
  if (opts_.chunks != 1 || shape_.max_rows < 1 || shape_.max_sampled < 1 ||
      shape_.max_sampled > shape_.max_rows || shape_.cache_slots < 1 ||
      shape_.cache_positions > cfg_.context || shape_.adapter_slots < 0 ||
      (shape_.adapter_slots > 0 && shape_.max_lora_rank < 1)) {
    throw std::logic_error("TransformerDecoder: one model chunk and a positive shape within the context");
  }
  opts_.sequence_parallel = false;
  tp_rank_ = tp.rank();
  const int64_t tp_size = tp.size();
  vocab_local_ = cfg_.padded_vocab(tp_size) / tp_size;
  vocab_start_ = tp_rank_ * vocab_local_;
  vocab_valid_ = std::clamp<int64_t>(cfg_.vocab - vocab_start_, 0, vocab_local_);
  for (ParamInfo& p : stage_params(cfg_, opts_, tp_rank_, tp_size)) params_.add(std::move(p));
  ix_ = stage_param_index(cfg_, opts_);
  params_.allocate(backend_, opts_.compute_dtype, 1, GradBuffer::none);
  if (shape_.adapter_slots > 0) {
    const StageOptions pool = pool_options();
    const std::vector<LoraLayerParams> at = lora_layer_index(pool);
    for (size_t l = 0; l < ix_.layers.size(); ++l) ix_.layers[l].lora = at[l];
    for (int64_t k = 0; k < shape_.adapter_slots; ++k) {
      auto store = std::make_unique<ParamStore>();
      for (ParamInfo& p : lora_stage_params(cfg_, pool, tp_rank_, tp_size)) store->add(std::move(p));
      store->allocate(backend_, opts_.compute_dtype, 1, GradBuffer::none);
      adapters_.push_back({.store = store.get()});
      adapter_pool_.push_back(std::move(store));
    }
    row_runs_.reserve(static_cast<size_t>(shape_.max_rows));
    kept_runs_.reserve(static_cast<size_t>(shape_.max_sampled));
  }

  const int64_t d = cfg_.head_dim();
  // The cache holds this rank's key/value heads: kv_heads / tp (grouped-query attention).
  const int64_t kv_heads = spec_.kv_heads_local();
  const size_t per_cache = static_cast<size_t>(shape_.cache_slots * kv_heads *
                                               shape_.cache_positions * d) *
                           dtype_size(opts_.compute_dtype);
  cache_arena_ = backend_.device().make_arena(
      2 * static_cast<size_t>(opts_.num_layers) * (per_cache + Arena::kAlign) + Arena::kAlign,
      "kv cache");
  for (int64_t l = 0; l < opts_.num_layers; ++l) {
    for (std::vector<Tensor>* c : {&k_cache_, &v_cache_}) {
      c->push_back(cache_arena_.alloc(opts_.compute_dtype, {shape_.cache_slots, kv_heads,
                                                            shape_.cache_positions, d}));
    }
  }
  Arena counting;
  layout_step(counting);
  step_arena_ = backend_.device().make_arena(counting.used(), "decode step");
  layout_step(step_arena_);
  host_tokens_.resize(static_cast<size_t>(shape_.max_rows));
  host_positions_.resize(static_cast<size_t>(shape_.max_rows));
  host_rows_.resize(static_cast<size_t>(2 * shape_.max_rows));
  host_picked_.resize(static_cast<size_t>(shape_.max_sampled));
  if (spec_.rope()) backend_.from_host(rope_table_, rope_table(cfg_, shape_.cache_positions).data());
}

void TransformerDecoder::layout_step(Arena& arena) {
  const DType t = opts_.compute_dtype, f32 = DType::f32, i32 = DType::i32;
  const int64_t r = shape_.max_rows, s = shape_.max_sampled, c = cfg_.d_model;
  const int64_t qkv_local = spec_.qkv_local(), attn_local = spec_.attn_local();
  const int64_t up_local = spec_.up_local(), ffn_local = spec_.ffn_local();
  tokens_ = arena.alloc(i32, {r});
  positions_ = arena.alloc(i32, {r});
  rows_ = arena.alloc(i32, {r, 2});
  x_ = arena.alloc(t, {r, c});
  pos_emb_ = opts_.has_embedding && spec_.learned_positions() ? arena.alloc(t, {r, c}) : Tensor{};
  ln_ = arena.alloc(t, {r, c});
  mean_ = spec_.norm_has_bias() ? arena.alloc(f32, {r}) : Tensor{};
  rstd_ = arena.alloc(f32, {r});
  qkv_ = arena.alloc(t, {r, qkv_local});
  qkv_raw_ = spec_.qk_norm ? arena.alloc(t, {r, qkv_local}) : Tensor{};
  qk_rstd_ = spec_.qk_norm ? arena.alloc(f32, {r, spec_.heads_local() + spec_.kv_heads_local()})
                           : Tensor{};
  atty_ = arena.alloc(t, {r, attn_local});
  proj_ = arena.alloc(t, {r, c});
  fch_ = arena.alloc(t, {r, up_local});
  fch_act_ = arena.alloc(t, {r, ffn_local});
  if (shape_.adapter_slots > 0) {
    lora_h_ = arena.alloc(t, {r, shape_.max_lora_rank});
    lora_scratch_ = arena.alloc(t, {r * std::max({qkv_local, up_local, ffn_local, c})});
  }
  rope_table_ = spec_.rope() ? arena.alloc(f32, {shape_.cache_positions, spec_.head_dim}) : Tensor{};
  if (opts_.has_head) {
    picked_rows_ = arena.alloc(i32, {s});
    picked_ = arena.alloc(t, {s, c});
    picked_atty_ = arena.alloc(t, {s, attn_local});
    lnf_ = arena.alloc(t, {s, c});
    lnf_mean_ = spec_.norm_has_bias() ? arena.alloc(f32, {s}) : Tensor{};
    lnf_rstd_ = arena.alloc(f32, {s});
    logits_ = arena.alloc(t, {s, vocab_local_});
    logits_f32_ = t == f32 ? logits_ : arena.alloc(f32, {s, vocab_local_});
  }
}

StageOptions TransformerDecoder::pool_options() const {
  StageOptions pool = opts_;
  pool.lora = {.rank = shape_.max_lora_rank, .alpha = 1, .targets = adaptable_lora_targets(cfg_)};
  return pool;
}

void TransformerDecoder::set_adapter(int32_t slot, const ParamStore& adapter, const LoraShape& lora) {
  if (slot < 0 || slot >= shape_.adapter_slots || lora.rank < 1 ||
      lora.rank > shape_.max_lora_rank ||
      (lora.targets.bits & ~adaptable_lora_targets(cfg_).bits) != 0) {
    throw std::logic_error(fmt::format(
        "TransformerDecoder: adapter slot {} of {}, rank {} of at most {}, maps {} within {}", slot,
        shape_.adapter_slots, lora.rank, shape_.max_lora_rank, describe(lora.targets),
        describe(adaptable_lora_targets(cfg_))));
  }
  StageOptions own = opts_;
  own.lora = lora;
  const std::vector<LoraLayerParams> from = lora_layer_index(own);
  LoraAdapter& to = adapters_[static_cast<size_t>(slot)];
  to.rank = lora.rank;
  to.targets = lora.targets;
  to.scale = static_cast<float>(lora.scale());
  const LoraAdapter source{.store = &adapter, .rank = lora.rank, .targets = lora.targets};
  for (size_t l = 0; l < from.size(); ++l) {
    const LoraLayerParams& pool = ix_.layers[l].lora;
    for (LoraTarget t : kLoraTargets) {
      if (!lora.targets.has(t)) continue;
      const auto i = static_cast<size_t>(t);
      backend_.copy(to.a(pool.a[i]), source.a(from[l].a[i]));
      backend_.copy(to.b(pool.b[i]), source.b(from[l].b[i]));
    }
  }
}

void TransformerDecoder::clear_adapter(int32_t slot) {
  if (has_adapter(slot)) adapters_[static_cast<size_t>(slot)].rank = 0;
}

bool TransformerDecoder::has_adapter(int32_t slot) const {
  return slot >= 0 && slot < shape_.adapter_slots && adapters_[static_cast<size_t>(slot)].rank > 0;
}

void TransformerDecoder::group_adapter_rows(std::span<const DecodeRow> rows,
                                    std::span<const int32_t> sampled) {
  auto runs = [this](std::vector<LoraRows>& out, size_t n, auto adapter_of) {
    out.clear();
    for (size_t i = 0; i < n; ++i) {
      const int32_t a = adapter_of(i);
      if (a < 0) continue;
      if (!out.empty() && out.back().adapter == &adapters_[static_cast<size_t>(a)] &&
          out.back().begin + out.back().count == static_cast<int64_t>(i)) {
        ++out.back().count;
      } else {
        out.push_back({static_cast<int64_t>(i), 1, &adapters_[static_cast<size_t>(a)]});
      }
    }
  };
  runs(row_runs_, rows.size(), [&](size_t i) { return rows[i].adapter; });
  runs(kept_runs_, sampled.size(),
       [&](size_t k) { return rows[static_cast<size_t>(sampled[k])].adapter; });
}

void TransformerDecoder::forward(std::span<const DecodeRow> rows, std::span<const int32_t> sampled) {
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n < 1 || n > shape_.max_rows || static_cast<int64_t>(sampled.size()) > shape_.max_sampled) {
    throw std::logic_error(fmt::format("TransformerDecoder: {} rows, {} sampled (shape {} rows, {} sampled)",
                                       n, sampled.size(), shape_.max_rows, shape_.max_sampled));
  }
  for (int64_t i = 0; i < n; ++i) {
    const DecodeRow& r = rows[static_cast<size_t>(i)];
    if (r.slot < 0 || r.slot >= shape_.cache_slots || r.position < 0 ||
        r.position >= shape_.cache_positions) {
      throw std::logic_error(fmt::format("TransformerDecoder: row {} slot {} position {} outside the cache",
                                         i, r.slot, r.position));
    }
    if (r.adapter >= 0 && !has_adapter(r.adapter)) {
      throw std::logic_error(fmt::format("TransformerDecoder: row {} names adapter slot {}, which is empty",
                                         i, r.adapter));
    }
    host_tokens_[static_cast<size_t>(i)] = r.token;
    host_positions_[static_cast<size_t>(i)] = r.position;
    host_rows_[static_cast<size_t>(2 * i)] = r.slot;
    host_rows_[static_cast<size_t>(2 * i + 1)] = r.position;
  }
  backend_.from_host(rows_.rows(0, n), host_rows_.data());
  TensorParallelRegion region(backend_, tp_);  // no sequence parallelism in decoding
  // RoPE rotates each row by its position: the rows' second column.
  const LayerContext context{backend_, region, params_, spec_, rope_table_, rows_.rows(0, n)};
  Tensor x = x_.rows(0, n);
  if (opts_.has_embedding) {
    backend_.from_host(tokens_.rows(0, n), host_tokens_.data());
    backend_.from_host(positions_.rows(0, n), host_positions_.data());
    // Vocab-parallel embedding (zeros outside this rank's slice, then the all-reduce), then
    // each row's own position: the position table looked up like a vocabulary.
    backend_.token_embedding_fwd(x, tokens_.rows(0, n), params_.weight(ix_.wte), vocab_start_);
    region.reduce(x, x);
    if (spec_.learned_positions()) {
      backend_.token_embedding_fwd(pos_emb_.rows(0, n), positions_.rows(0, n),
                                   params_.weight(ix_.wpe), 0);
      backend_.add(x, x, pos_emb_.rows(0, n));
    }
  }
  const int64_t s = static_cast<int64_t>(sampled.size());
  for (int64_t k = 0; k < s; ++k) {
    const int32_t row = sampled[static_cast<size_t>(k)];
    if (row < 0 || row >= n) throw std::logic_error("TransformerDecoder: sampled row outside the step");
  }
  // On the last stage the last layer continues with the sampled rows only (none: just the
  // cache), gathered into picked_ in their order: unless they are every row in order (a
  // decode step), where the gather would only copy.
  bool every_row = s == n;
  for (int64_t k = 0; every_row && k < s; ++k) every_row = sampled[static_cast<size_t>(k)] == k;
  const bool compact = opts_.has_head && !every_row && !ix_.layers.empty();
  if (compact && s > 0) {
    std::copy(sampled.begin(), sampled.end(), host_picked_.begin());
    backend_.from_host(picked_rows_.rows(0, s), host_picked_.data());
  }
  // The residual stream is added in place: x is each layer's input and both its residuals.
  Tensor ln = ln_.rows(0, n), mean = mean_.empty() ? mean_ : mean_.rows(0, n),
         rstd = rstd_.rows(0, n);
  LayerTensors layer{.input = x, .ln1 = ln, .ln1_full = ln, .ln1_mean = mean,
                           .ln1_rstd = rstd, .qkv = qkv_.rows(0, n), .atty = atty_.rows(0, n),
                           .probs = Tensor{}, .residual2 = x, .ln2 = ln, .ln2_full = ln,
                           .ln2_mean = mean, .ln2_rstd = rstd, .fch = fch_.rows(0, n),
                           .fch_act = fch_act_.rows(0, n), .residual3 = x,
                           .proj_full = proj_.rows(0, n), .proj_part = proj_.rows(0, n)};
  if (spec_.qk_norm) {
    layer.qkv_raw = qkv_raw_.rows(0, n);
    layer.qk_rstd = qk_rstd_.rows(0, n);
  }
  if (shape_.adapter_slots > 0) {
    group_adapter_rows(rows, sampled);
    layer.lora_rows = row_runs_;
    layer.lora_h.fill(lora_h_);  // each map's h is used at once
    layer.lora_scratch = lora_scratch_;
  }
  for (size_t l = 0; l < ix_.layers.size(); ++l) {
    const bool last = l + 1 == ix_.layers.size();
    KvCacheAttention attention(k_cache_[l], v_cache_[l], rows_.rows(0, n),
                               {.rows = picked_rows_, .input = picked_, .atty = picked_atty_,
                                .count = compact && last ? s : -1, .lora_rows = kept_runs_});
    transformer_layer_forward(context, ix_.layers[l], attention, layer);
  }
  if (!opts_.has_head || sampled.empty()) return;
  if (!compact) {
    for (int64_t k = 0; k < s; ++k) {
      backend_.copy(picked_.rows(k, 1), x.rows(sampled[static_cast<size_t>(k)], 1));
    }
  }
  // The sampled rows' logits: padding (-inf) takes no part in sampling.
  Tensor lnf = lnf_.rows(0, s);
  head_logits_forward(context, {.head = ix_.head, .lnf_w = ix_.lnf_w, .lnf_b = ix_.lnf_b},
                      {.lnf = lnf, .lnf_full = lnf,
                       .lnf_mean = lnf_mean_.empty() ? lnf_mean_ : lnf_mean_.rows(0, s),
                       .lnf_rstd = lnf_rstd_.rows(0, s), .logits = logits_.rows(0, s)},
                      picked_.rows(0, s), vocab_valid_);
  // bf16 -inf widens to f32 -inf: the same bits as filling the f32 copy.
  if (logits_f32_.data != logits_.data) backend_.copy(logits_f32_.rows(0, s), logits_.rows(0, s));
}

}  // namespace jumbo
