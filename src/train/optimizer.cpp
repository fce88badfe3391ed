#include "jumbo/train/optimizer.h"

#include <cmath>

namespace jumbo {

AdamW::AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg,
             std::vector<OptimRange> ranges, int64_t state_elems,
             std::vector<OptimRange> norm_ranges)
    : params_(params), backend_(backend), cfg_(cfg), ranges_(std::move(ranges)) {
  for (const OptimRange& r : ranges_) {
    adam_ranges_.push_back({r.flat, r.local, r.count, params.info(r.param).weight_decay});
  }
  for (const OptimRange& r : norm_ranges) norm_spans_.push_back({r.local, r.count});
  arena_ = backend.device().make_arena(2 * static_cast<size_t>(state_elems) * 4 + 2 * Arena::kAlign,
                                       "adam");
  m_ = arena_.alloc(DType::f32, {state_elems});
  v_ = arena_.alloc(DType::f32, {state_elems});
  backend.fill(m_, 0.0f);
  backend.fill(v_, 0.0f);
}

AdamW::AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg, const StagePlan& plan)
    : AdamW(params, backend, cfg, plan.optimizer_ranges, plan.optimizer_state_elems,
            plan.grad_norm_ranges) {}

AdamW::AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg)
    : AdamW(params, backend, cfg, all_param_ranges(params), params.total_numel(),
            grad_norm_ranges(params, all_param_ranges(params), 0)) {}

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
  backend_.adamw(params_.all_master(), grads, m_, v_,
                 params_.mixed_precision() ? params_.all_compute() : Tensor{}, adam_ranges_, s);
}

double AdamW::grad_norm_squared(Tensor grads) { return backend_.sum_squares(grads, norm_spans_); }

}  // namespace jumbo
