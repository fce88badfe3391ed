#pragma once
// AdamW over the ranges of the flat parameter buffer this rank updates: every parameter on
// one rank or with plain data parallelism, its owned shards under ZeRO-1. f32 master weights
// and moments; weight decay on matrices and embeddings only; the compute copy (bf16 in mixed
// precision) is refreshed in the same pass.
#include <cstdint>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/model/params.h"
#include "jumbo/parallel/sharding.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {

class AdamW {
 public:
  // The optimizer ranges, state length and grad-norm ranges of the rank's stage plan.
  AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg, const StagePlan& plan);
  // Every parameter of `params` (one rank).
  AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg);
  // One update; `grads` is indexed by OptimRange::local and scaled by grad_scale first.
  void step(double lr, float grad_scale, Tensor grads);
  void step(double lr, float grad_scale) { step(lr, grad_scale, params_.all_grads()); }
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }  // resuming from a checkpoint
  size_t state_bytes() const { return arena_.used(); }
  const std::vector<OptimRange>& ranges() const { return ranges_; }
  // Sum of squares of this rank's share of the gradient (`grads` indexed like step's): its
  // grad-norm ranges. Summed over the plan's group it is the global norm squared.
  double grad_norm_squared(Tensor grads);
  Tensor exp_avg() const { return m_; }
  Tensor exp_avg_sq() const { return v_; }

 private:
  ParamStore& params_;
  Backend& backend_;
  TrainConfig cfg_;
  AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg,
        std::vector<OptimRange> ranges, int64_t state_elems, std::vector<OptimRange> norm_ranges);

  std::vector<OptimRange> ranges_;
  std::vector<AdamWRange> adam_ranges_;  // the same ranges with their weight decay, for the kernel
  std::vector<FlatSpan> norm_spans_;     // the grad-norm ranges in the gradient source
  Arena arena_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

}  // namespace jumbo
