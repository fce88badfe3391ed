#include "jumbo/train/schedule.h"

#include <algorithm>
#include <cmath>

namespace jumbo {

LrSchedule::LrSchedule(const TrainConfig& t, int64_t decay_tokens)
    : lr_(t.lr), min_lr_(t.min_lr), warmup_(t.warmup_tokens), decay_(decay_tokens) {}

double LrSchedule::at(int64_t tokens) const {
  if (warmup_ > 0 && tokens <= warmup_) {
    return lr_ * static_cast<double>(tokens) / static_cast<double>(warmup_);
  }
  if (tokens >= decay_) return min_lr_;
  const double span = static_cast<double>(decay_ - warmup_);
  const double progress = span > 0 ? static_cast<double>(tokens - warmup_) / span : 1.0;
  return min_lr_ + (lr_ - min_lr_) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

BatchRamp::BatchRamp(const TrainConfig& t, int64_t increment)
    : start_(t.rampup_start_batch),
      target_(t.global_batch),
      increment_(increment),
      rampup_tokens_(t.rampup_tokens) {}

int64_t BatchRamp::at(int64_t tokens) const {
  if (start_ <= 0 || start_ >= target_ || rampup_tokens_ <= 0) return target_;
  // Megatron's rule: (target - start) / increment equal stages spread over the ramp tokens.
  const int64_t stages = (target_ - start_) / increment_;
  const double per_stage = static_cast<double>(rampup_tokens_) / static_cast<double>(stages);
  const int64_t done = static_cast<int64_t>(static_cast<double>(tokens) / per_stage);
  return std::min(target_, start_ + done * increment_);
}

int64_t total_run_tokens(const RunConfig& cfg, int64_t dp) {
  const BatchRamp ramp(cfg.train, cfg.parallel.micro_batch * dp);
  int64_t tokens = 0;
  for (int64_t s = 0; s < cfg.train.steps; ++s) tokens += ramp.at(tokens) * cfg.model.context;
  return tokens;
}

}  // namespace jumbo
