#include "jumbo/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace jumbo {

AdamW::AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg,
             std::vector<OptimRange> ranges, int64_t state_elems,
             std::vector<OptimRange> norm_ranges)
    : params_(params), backend_(backend), cfg_(cfg), ranges_(std::move(ranges)) {
  const bool own_master = params.compute_dtype() != DType::f32;
  master_index_ = own_master ? MasterIndex::local : MasterIndex::flat;
  for (const OptimRange& r : ranges_) {
    adam_ranges_.push_back({.flat = r.flat, .local = r.local, .count = r.count,
                            .master = own_master ? r.local : r.flat,
                            .weight_decay = params.info(r.param).weight_decay});
  }
  for (const OptimRange& r : norm_ranges) norm_spans_.push_back({r.flat, r.count});
  const size_t tensors = own_master ? 3 : 2;
  arena_ = backend.device().make_arena(
      tensors * (static_cast<size_t>(state_elems) * 4 + Arena::kAlign), "adam");
  m_ = arena_.alloc(DType::f32, {state_elems});
  v_ = arena_.alloc(DType::f32, {state_elems});
  backend.fill(m_, 0.0f);
  backend.fill(v_, 0.0f);
  if (own_master) {
    master_ = arena_.alloc(DType::f32, {state_elems});
    backend.fill(master_, 0.0f);
    initialize_master();
  } else {
    master_ = params.all_weights();
  }
}

AdamW::AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg, const StagePlan& plan)
    : AdamW(params, backend, cfg, plan.optimizer_ranges, plan.optimizer_state_elems,
            plan.grad_norm_ranges) {}

AdamW::AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg)
    : AdamW(params, backend, cfg, all_param_ranges(params), params.total_numel(),
            grad_norm_ranges(params, all_param_ranges(params), 0)) {}

// The master of each range from the initial values the weights were rounded from, a
// bounded chunk at a time.
void AdamW::initialize_master() {
  const std::optional<uint64_t> seed = params_.init_seed();
  if (!seed) throw std::logic_error("AdamW: the parameters are not initialized yet");
  constexpr int64_t kChunk = int64_t{1} << 16;
  std::vector<float> values;
  for (const OptimRange& r : ranges_) {
    const int64_t begin = r.flat - params_.info(r.param).flat_offset;
    for (int64_t at = 0; at < r.count; at += kChunk) {
      const int64_t n = std::min(kChunk, r.count - at);
      values.resize(static_cast<size_t>(n));
      params_.initial_values(r.param, *seed, begin + at, n, values.data());
      write_from_f32(backend_, master_.rows(r.local + at, n), values.data());
    }
  }
}

void AdamW::write_weights() {
  if (master_index_ == MasterIndex::flat) return;
  const Tensor weights = params_.all_weights();
  for (const OptimRange& r : ranges_) {
    backend_.copy(weights.rows(r.flat, r.count), master_.rows(r.local, r.count));
  }
}

void AdamW::step(double lr, float grad_scale, Tensor grads) {
  ++step_;
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(cfg_.beta1);
  s.beta2 = static_cast<float>(cfg_.beta2);
  s.eps = static_cast<float>(cfg_.eps);
  s.weight_decay = static_cast<float>(cfg_.weight_decay);
  s.step = step_;
  s.grad_scale = grad_scale;
  const Tensor copy = master_index_ == MasterIndex::local ? params_.all_weights() : Tensor{};
  backend_.adamw(master_, grads, m_, v_, copy, adam_ranges_, s);
}

double AdamW::grad_norm_squared(Tensor grads) { return backend_.sum_squares(grads, norm_spans_); }

}  // namespace jumbo
