#pragma once
// Per-step metrics: a JSON line per step to log.metrics_file, a human line on rank 0.
// Fields are documented in docs/metrics.md.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/obs/stragglers.h"

namespace jumbo {

// What the anomaly guard saw at a step and what the run did (train.on_anomaly).
struct StepAnomaly {
  // Its kind, what was done (action: stop, or the skip or rewind recorded) and the samples
  // skipped; the samples mean nothing for a stop.
  SkippedSamples record;
  AnomalyAction requested = AnomalyAction::stop;  // train.on_anomaly (a rewind with no
                                                  // earlier checkpoint is a skip)
  double running_mean = 0;  // the statistic (0: spikes not checked yet)
  double threshold = 0;     // spike_ratio x running_mean
  int64_t recent = 0;        // anomalies within train.anomaly_window steps, this one included
  int64_t limit = 0;         // train.max_anomalies
  int64_t window = 0;        // train.anomaly_window
};

struct StepMetrics {
  int64_t step = 0;            // 1-based optimizer step just finished
  int64_t total_steps = 0;
  double loss = 0;             // mean training loss over the step's tokens (nats)
  double lr = 0;
  double grad_norm = 0;        // global norm before clipping
  int64_t global_batch = 0;    // sequences this step (changes during batch ramp-up)
  int64_t tokens = 0;          // tokens consumed so far, this step included
  double tokens_per_s = 0;
  double tflops_per_device = 0;  // model FLOPs / step time / world size
  double mfu = 0;              // tflops_per_device / peak
  double step_time_s = 0;
  uint64_t mem_peak_bytes = 0; // peak resident memory of this process
  double eta_s = 0;            // estimated time left
  std::optional<double> val_loss;  // the data.valid-weighted mean of val_losses
  std::vector<std::pair<std::string, double>> val_losses;  // per validation set, by name
  // log.comm: bytes this rank handed to each group's operations during the step.
  std::vector<std::pair<std::string, uint64_t>> comm_bytes;
  std::optional<StepAnomaly> anomaly;  // an anomalous step (its loss and grad norm above)
  std::optional<RankTimes> ranks;      // every log interval of a run of several ranks
};

class MetricsLog {
 public:
  // path empty: no JSON file. Throws UserError naming the file if it cannot be opened.
  explicit MetricsLog(const std::string& path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const StepMetrics& m);  // one JSON line, flushed; the file is opened for append

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

std::string to_json_line(const StepMetrics& m);
// "step   12/200 | loss 5.1234 | val 5.3000 | lr 3.00e-04 | gnorm 0.850 | batch 32 | 12.3k tok/s |
//  0.103 TFLOP/s | MFU 51.2% | mem 1.2 GiB | left 3m12s" (val only when present)
std::string human_line(const StepMetrics& m);
// "step 57: loss spike: 9.8123 > 1.50 x running mean 6.1012; skipped the update (samples
// 912-927 not trained on); anomaly 1 of at most 5 in 1000 steps"
std::string anomaly_line(const StepMetrics& m);
std::string format_duration(double seconds);  // "45s", "3m12s", "2h05m", "3d04h"
// "512 B", "793.0 KiB", "1.39 GiB": binary units, `decimals` digits above bytes.
std::string human_bytes(double bytes, int decimals);

}  // namespace jumbo
