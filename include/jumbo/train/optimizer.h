#pragma once
// AdamW over a ParamStore: f32 master weights, f32 first/second moments in one arena,
// weight decay on matrices and embeddings only, the bf16 compute copy refreshed in the same pass.
#include <cstdint>

#include "jumbo/backend/backend.h"
#include "jumbo/config/config.h"
#include "jumbo/model/params.h"

namespace jumbo {

class AdamW {
 public:
  AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg);
  // One update with learning rate `lr`; grads are multiplied by grad_scale (clipping) first.
  void step(double lr, float grad_scale);
  int64_t steps_taken() const { return step_; }
  size_t state_bytes() const { return arena_.used(); }
  Tensor exp_avg() const { return m_; }
  Tensor exp_avg_sq() const { return v_; }

 private:
  ParamStore& params_;
  Backend& backend_;
  TrainConfig cfg_;
  Arena arena_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

// Global L2 norm of the main grads of this rank (one rank: all of them).
double grad_norm(ParamStore& params, Backend& backend);

}  // namespace jumbo
