#include "jumbo/train/optimizer.h"

#include <cmath>

namespace jumbo {

std::vector<OptimRange> all_param_ranges(const ParamStore& params) {
  std::vector<OptimRange> r;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params.info(static_cast<int>(i));
    r.push_back({p.flat_offset, p.flat_offset, p.numel(), static_cast<int>(i)});
  }
  return r;
}

AdamW::AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg,
             std::vector<OptimRange> ranges, int64_t state_elems)
    : params_(params), backend_(backend), cfg_(cfg), ranges_(std::move(ranges)) {
  arena_ = backend.make_arena(2 * static_cast<size_t>(state_elems) * 4 + 2 * Arena::kAlign, "adam");
  m_ = arena_.alloc(DType::f32, {state_elems});
  v_ = arena_.alloc(DType::f32, {state_elems});
  backend.fill(m_, 0.0f);
  backend.fill(v_, 0.0f);
}

AdamW::AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg)
    : AdamW(params, backend, cfg, all_param_ranges(params), params.total_numel()) {}

void AdamW::step(double lr, float grad_scale, Tensor grads) {
  ++step_;
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(cfg_.beta1);
  s.beta2 = static_cast<float>(cfg_.beta2);
  s.eps = static_cast<float>(cfg_.eps);
  s.step = step_;
  s.grad_scale = grad_scale;
  const bool mixed = params_.mixed_precision();
  for (const OptimRange& r : ranges_) {
    s.weight_decay = params_.info(r.param).weight_decay ? static_cast<float>(cfg_.weight_decay) : 0.f;
    backend_.adamw(params_.all_master().rows(r.flat, r.count), grads.rows(r.local, r.count),
                   m_.rows(r.local, r.count), v_.rows(r.local, r.count),
                   mixed ? params_.all_compute().rows(r.flat, r.count) : Tensor{}, s);
  }
}

double grad_norm_squared(const ParamStore& params, const std::vector<OptimRange>& ranges,
                         Tensor grads, Backend& backend, int tp_rank) {
  // Reused between steps: the step loop allocates nothing once it has run.
  thread_local std::vector<Tensor> parts;
  parts.clear();
  for (const OptimRange& r : ranges) {
    const ParamInfo& p = params.info(r.param);
    if ((p.tp_replicated && tp_rank != 0) || p.pipeline_copy) continue;
    parts.push_back(grads.rows(r.local, r.count));
  }
  return backend.sum_squares_all(parts);
}

}  // namespace jumbo
