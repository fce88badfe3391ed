#include "jumbo/obs/step_meter.h"

#include "jumbo/comm/watchdog.h"
#include "jumbo/obs/memory.h"

namespace jumbo {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

StepMeter::StepMeter(int64_t total_steps, int world_size, double peak_tflops)
    : total_steps_(total_steps), world_size_(world_size), peak_tflops_(peak_tflops) {}

void StepMeter::start_step() { step_start_ = Clock::now(); }

void StepMeter::start_compute() {
  wait_before_ = comm_wait_seconds();
  compute_start_ = Clock::now();
}

void StepMeter::end_compute() {
  const double waited = comm_wait_seconds() - wait_before_;
  interval_wait_s_ += waited;
  interval_compute_s_ += seconds_since(compute_start_) - waited;
}

void StepMeter::finish_step(StepMetrics& m, int64_t batch_tokens, double model_flops) {
  const double dt = seconds_since(step_start_);
  time_spent_ += dt;
  ++steps_timed_;
  m.total_steps = total_steps_;
  m.step_time_s = dt;
  m.tokens_per_s = static_cast<double>(batch_tokens) / dt;
  m.tflops_per_device = model_flops / dt / static_cast<double>(world_size_) / 1e12;
  m.mfu = m.tflops_per_device / peak_tflops_;
  m.mem_peak_bytes = peak_rss_bytes();
  m.eta_s = time_spent_ / static_cast<double>(steps_timed_) *
            static_cast<double>(total_steps_ - m.step);
}

std::pair<double, double> StepMeter::take_interval() {
  const std::pair<double, double> interval{interval_compute_s_, interval_wait_s_};
  interval_compute_s_ = interval_wait_s_ = 0;
  return interval;
}

}  // namespace jumbo
