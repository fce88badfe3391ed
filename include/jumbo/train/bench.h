#pragma once
// `jumbo bench train`: full training steps (forward, backward, AdamW) of a model on synthetic
// tokens, reported against this machine's measured peak. A benchmark, not a test.
#include <cstdint>
#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/config/config.h"

namespace jumbo {

struct TrainBenchOptions {
  int64_t micro_batch = 8;
  int64_t seq = 128;
  int64_t micro_steps = 1;  // gradient accumulation per step
  int64_t warmup_steps = 1;
  int64_t steps = 3;
  Precision precision = Precision::fp32;
  double peak_tflops = 0;   // 0: measure this machine's fp32 peak
};

struct TrainBenchResult {
  double step_time_s = 0;       // median over the timed steps
  double tokens_per_s = 0;
  double model_tflops = 0;      // achieved model TFLOP/s
  double peak_tflops = 0;
  double mfu = 0;
  double flops_per_step = 0;
  int64_t parameters = 0;
  double loss_first = 0, loss_last = 0;
};

TrainBenchResult bench_train(const ModelConfig& model, const TrainBenchOptions& opts,
                             Backend& backend);
std::string describe(const TrainBenchResult& r, const ModelConfig& model,
                     const TrainBenchOptions& opts);

}  // namespace jumbo
