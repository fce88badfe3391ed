#pragma once
// Learning-rate and batch-size schedules, both functions of tokens consumed (GPT-3 appendix B):
// linear warm-up, cosine decay to min_lr, and a linear batch ramp-up.
#include <cstdint>

#include "jumbo/config/config.h"

namespace jumbo {

class LrSchedule {
 public:
  LrSchedule(const TrainConfig& t, int64_t decay_tokens);
  // Learning rate for a step that ends with `tokens` consumed.
  double at(int64_t tokens) const;

 private:
  double lr_, min_lr_;
  int64_t warmup_, decay_;
};

class BatchRamp {
 public:
  // increment: micro_batch x data-parallel size (the batch grows in whole microbatch rounds).
  BatchRamp(const TrainConfig& t, int64_t increment);
  // Global batch (sequences) for a step that starts with `tokens` consumed.
  int64_t at(int64_t tokens) const;

 private:
  int64_t start_, target_, increment_, rampup_tokens_;
};

// Tokens a run of cfg.train.steps consumes, following the batch ramp (the default cosine length).
int64_t total_run_tokens(const RunConfig& cfg, int64_t dp);

}  // namespace jumbo
