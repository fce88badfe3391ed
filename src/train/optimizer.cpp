#include "jumbo/train/optimizer.h"

#include <cmath>

namespace jumbo {

AdamW::AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg)
    : params_(params), backend_(backend), cfg_(cfg) {
  const int64_t n = params.total_numel();
  arena_ = backend.make_arena(2 * static_cast<size_t>(n) * 4 + 2 * Arena::kAlign, "adam");
  m_ = arena_.alloc(DType::f32, {n});
  v_ = arena_.alloc(DType::f32, {n});
  backend.fill(m_, 0.0f);
  backend.fill(v_, 0.0f);
}

void AdamW::step(double lr, float grad_scale) {
  ++step_;
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(cfg_.beta1);
  s.beta2 = static_cast<float>(cfg_.beta2);
  s.eps = static_cast<float>(cfg_.eps);
  s.step = step_;
  s.grad_scale = grad_scale;
  const bool mixed = params_.mixed_precision();
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_.info(static_cast<int>(i));
    s.weight_decay = p.weight_decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    const int64_t off = p.flat_offset, n = p.numel();
    Tensor master = params_.all_master().rows(off, n);
    backend_.adamw(master, params_.all_grads().rows(off, n), m_.rows(off, n), v_.rows(off, n),
                   mixed ? params_.all_compute().rows(off, n) : Tensor{}, s);
  }
}

double grad_norm(ParamStore& params, Backend& backend) {
  return std::sqrt(backend.sum_squares(params.all_grads()));
}

}  // namespace jumbo
