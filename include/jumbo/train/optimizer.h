#pragma once
// AdamW over the ranges of the flat parameter buffer this rank updates: every parameter on
// one rank or with plain data parallelism, its owned shards under ZeRO-1 (Megatron's
// distributed optimizer). In mixed precision the optimizer holds the fp32 master weights of
// its ranges, next to the moments (so under ZeRO-1 the master is sharded too: 6 + 12/dp bytes
// per parameter with the bf16 weights and f32 grads); in fp32 the weights are the master.
// Each step updates the master and writes the compute copy of the same ranges.
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
  // The optimizer ranges, state length and grad-norm ranges of the rank's stage plan. In
  // mixed precision `params` must be initialized: the master starts from the same values.
  AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg, const StagePlan& plan);
  // Every parameter of `params` (one rank).
  AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg);
  // One update; `grads` is the flat gradient buffer, scaled by grad_scale first.
  void step(double lr, float grad_scale, Tensor grads);
  void step(double lr, float grad_scale) { step(lr, grad_scale, params_.all_grads()); }
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }  // resuming from a checkpoint
  // The optimizer's own memory: Adam's moments and (mixed precision) the master.
  size_t state_bytes() const { return arena_.used(); }
  const std::vector<OptimRange>& ranges() const { return ranges_; }
  // Sum of squares of this rank's share of the gradient (`grads` as step's): its grad-norm
  // ranges. Summed over the plan's group it is the global norm squared.
  double grad_norm_squared(Tensor grads);
  Tensor exp_avg() const { return m_; }
  Tensor exp_avg_sq() const { return v_; }
  // The f32 master weights, indexed as master_index() says.
  Tensor master() const { return master_; }
  MasterIndex master_index() const { return master_index_; }
  // Writes the compute copy of this rank's ranges from the master (after a checkpoint
  // load); nothing in fp32, where the master is the weights.
  void write_weights();

 private:
  ParamStore& params_;
  Backend& backend_;
  TrainConfig cfg_;
  AdamW(ParamStore& params, Backend& backend, const TrainConfig& cfg,
        std::vector<OptimRange> ranges, int64_t state_elems, std::vector<OptimRange> norm_ranges);
  void initialize_master();

  std::vector<OptimRange> ranges_;
  std::vector<AdamWRange> adam_ranges_;  // the same ranges with their weight decay, for the kernel
  std::vector<FlatSpan> norm_spans_;     // the grad-norm ranges in the flat gradient
  MasterIndex master_index_ = MasterIndex::flat;
  Arena arena_;
  Tensor m_, v_, master_;
  int64_t step_ = 0;
};

}  // namespace jumbo
