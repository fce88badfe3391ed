#pragma once
// StepMeter: a run's clock and throughput accounting, one home for what a step line and the
// metrics file say about time: the step's wall time, tokens/s, model TFLOP/s per device and
// MFU against the run's peak, the peak memory, the time left, and this rank's compute and
// communication-wait seconds between straggler reports.
#include <chrono>
#include <cstdint>
#include <utility>

#include "jumbo/obs/metrics.h"

namespace jumbo {

class StepMeter {
 public:
  StepMeter(int64_t total_steps, int world_size, double peak_tflops);
  void start_step();     // the step's clock starts (before its data and its request)
  void start_compute();  // the optimizer step begins
  void end_compute();    // it returned: its time less the communication waits in it
  // The timing fields of `m` (m.step set): step time, tokens/s, TFLOP/s per device, MFU,
  // memory and ETA, for a step of batch_tokens tokens and model_flops model FLOPs.
  void finish_step(StepMetrics& m, int64_t batch_tokens, double model_flops);
  // This rank's (compute, wait) seconds since the last call: a straggler report's interval.
  std::pair<double, double> take_interval();

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_steps_;
  int world_size_;
  double peak_tflops_;
  Clock::time_point step_start_, compute_start_;
  double wait_before_ = 0;
  double time_spent_ = 0;  // over the steps this process ran, for the ETA
  int64_t steps_timed_ = 0;
  double interval_compute_s_ = 0, interval_wait_s_ = 0;
};

}  // namespace jumbo
