#include "jumbo/train/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "jumbo/comm/comm.h"
#include "jumbo/config/gpus.h"
#include "jumbo/model/flops.h"
#include "jumbo/model/gpt.h"
#include "jumbo/model/init.h"
#include "jumbo/obs/peak.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/train/step.h"

namespace jumbo {
namespace {

// Synthetic tokens from the counter generator: deterministic, no data files needed.
class SyntheticBatches final : public MicrobatchSource {
 public:
  SyntheticBatches(int64_t n, int64_t vocab) : n_(n), vocab_(vocab) {}
  void next(int32_t* tokens, int32_t* targets) override {
    for (int64_t i = 0; i < n_; ++i) {
      const float u = counter_normal(7, 11, static_cast<uint64_t>(calls_ * n_ + i));
      tokens[i] = static_cast<int32_t>(static_cast<int64_t>(std::abs(u) * 1e6) % vocab_);
      targets[i] = static_cast<int32_t>((tokens[i] * 31 + 7) % vocab_);
    }
    ++calls_;
  }

 private:
  int64_t n_, vocab_, calls_ = 0;
};

}  // namespace

TrainBenchResult bench_train(const ModelConfig& model, const TrainBenchOptions& opts,
                             Backend& backend) {
  ModelConfig m = model;
  if (opts.seq > m.context) m.context = opts.seq;
  // One rank (each process of an mpirun measures alone).
  Layout layout;
  layout.micro_batch = opts.micro_batch;
  layout.device = opts.device;
  const StepShape shape{.global_batch = opts.micro_batch * opts.micro_steps, .seq = opts.seq,
                        .precision = opts.precision};
  SoloStep solo(m, layout, shape, TrainConfig{}, backend, 1234);
  SyntheticBatches source(opts.micro_batch * opts.seq, m.vocab);
  const int64_t batch_tokens = opts.micro_batch * opts.micro_steps * opts.seq;

  TrainBenchResult r;
  if (opts.peak_tflops > 0) {
    r.peak_tflops = opts.peak_tflops;
  } else if (backend.device().kind() == Device::cuda) {
    const GpuSpec* gpu =
        gpu_from_device_name(backend.device().name(), backend.device().memory().total);
    if (!gpu) {
      throw UserError(fmt::format("bench train: {} is not a GPU jumbo knows the peak of: give "
                                  "--peak-tflops", backend.device().name()));
    }
    r.peak_tflops = gpu->bf16_tflops;
  } else {
    r.peak_tflops = measure_fp32_peak_gflops(0.5) / 1e3;
  }
  std::vector<double> times;
  backend.set_flush_denormals(true);  // as the trainer's step loop
  for (int64_t s = 0; s < opts.warmup_steps + opts.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult sr = train_step(solo.parts(), source, {.microbatches = opts.micro_steps,
                                                     .batch_tokens = batch_tokens,
                                                     .lr = 1e-4,
                                                     .grad_clip = 1.0});
    backend.stream().synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s == 0) r.loss_first = sr.loss;
    r.loss_last = sr.loss;
    if (s >= opts.warmup_steps) times.push_back(dt);
  }
  backend.set_flush_denormals(false);
  std::sort(times.begin(), times.end());
  r.step_time_s = times[times.size() / 2];
  r.flops_per_step = model_flops_per_iteration(m, opts.micro_batch * opts.micro_steps, opts.seq);
  r.tokens_per_s = static_cast<double>(batch_tokens) / r.step_time_s;
  r.model_tflops = r.flops_per_step / r.step_time_s / 1e12;
  r.mfu = r.model_tflops / r.peak_tflops;
  r.parameters = parameter_count(m);
  return r;
}

std::string describe(const TrainBenchResult& r, const ModelConfig& m,
                     const TrainBenchOptions& o) {
  return fmt::format(
      "bench train {}: {:.1f}M params, micro batch {} x seq {} x {} microbatches, {}\n"
      "  step (fwd+bwd+AdamW) {:.3f} s (median of {}), {:.0f} tokens/s\n"
      "  model FLOPs/step {:.1f} GFLOP = {}\n"
      "  achieved {:.1f} GFLOP/s of peak {:.1f} GFLOP/s ({}): MFU {:.1f}%\n"
      "  loss {:.3f} -> {:.3f}",
      m.name, static_cast<double>(r.parameters) / 1e6, o.micro_batch, o.seq, o.micro_steps,
      to_string(o.precision), r.step_time_s, o.steps, r.tokens_per_s, r.flops_per_step / 1e9,
      kModelFlopsFormula, r.model_tflops * 1e3, r.peak_tflops * 1e3,
      o.peak_tflops > 0 ? "given" : o.device == Device::cuda ? "the GPU's bf16 dense peak" : "measured fp32 FMA peak", r.mfu * 100, r.loss_first,
      r.loss_last);
}

}  // namespace jumbo
