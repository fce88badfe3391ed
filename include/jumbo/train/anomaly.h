#pragma once
// The anomaly guard (train.on_anomaly): says whether a step is anomalous from its loss and grad
// norm, which every rank holds alike after the step's reductions, so every rank decides alike
// without a further collective. It keeps the running mean of accepted losses, the record of
// the samples skipped, and the count against train.max_anomalies; all of it is saved in the
// checkpoint (CheckpointProgress::anomalies), so a resumed run decides as an unbroken one.
#include <cstdint>
#include <optional>
#include <vector>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/config/config.h"

namespace jumbo {

struct AnomalyVerdict {
  std::optional<AnomalyKind> kind;  // none: a normal step
  double running_mean = 0;          // what the loss was compared with (0: not yet)
  double threshold = 0;             // spike_ratio x running_mean (0: spikes not checked yet)
};

class AnomalyGuard {
 public:
  explicit AnomalyGuard(const TrainConfig& train);
  // Non-finite loss or grad norm; else, once spike_window steps fed the mean, a loss above
  // spike_ratio x the running mean.
  AnomalyVerdict check(double loss, double grad_norm) const;
  // An applied step's loss feeds the running mean: an exponential moving average with
  // alpha = 2 / (spike_window + 1) (a span of spike_window steps).
  void accept(double loss);
  // Adds an anomaly to the record; returns the anomalies whose step lies within the last
  // anomaly_window steps of its step, this one included (a rewind's later steps count too).
  int64_t record(const SkippedSamples& anomaly);
  bool over_limit(int64_t recent) const { return recent > max_anomalies_; }
  // A rewind takes the running mean the checkpoint had; the record stays (it is history).
  void restore_running_mean(const AnomalyProgress& saved);
  void restore(const AnomalyProgress& saved);  // a resume: mean and record
  const AnomalyProgress& progress() const { return state_; }

 private:
  double spike_ratio_, alpha_;
  int64_t spike_window_, max_anomalies_, anomaly_window_;
  AnomalyProgress state_;
};

}  // namespace jumbo
