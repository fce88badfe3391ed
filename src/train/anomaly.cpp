#include "jumbo/train/anomaly.h"

#include <algorithm>
#include <cmath>

namespace jumbo {

AnomalyGuard::AnomalyGuard(const TrainConfig& t)
    : spike_ratio_(t.spike_ratio),
      alpha_(2.0 / (static_cast<double>(t.spike_window) + 1.0)),
      spike_window_(t.spike_window),
      max_anomalies_(t.max_anomalies),
      anomaly_window_(t.anomaly_window) {}

AnomalyVerdict AnomalyGuard::check(double loss, double grad_norm) const {
  AnomalyVerdict v;
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    v.kind = AnomalyKind::nonfinite;
    return v;
  }
  if (spike_ratio_ == 0 || state_.losses_seen < spike_window_) return v;
  v.running_mean = state_.loss_mean;
  v.threshold = spike_ratio_ * state_.loss_mean;
  if (loss > v.threshold) v.kind = AnomalyKind::spike;
  return v;
}

void AnomalyGuard::accept(double loss) {
  state_.loss_mean = state_.losses_seen == 0 ? loss : state_.loss_mean + alpha_ * (loss - state_.loss_mean);
  ++state_.losses_seen;
}

int64_t AnomalyGuard::record(const SkippedSamples& anomaly) {
  state_.skipped.push_back(anomaly);
  return std::count_if(state_.skipped.begin(), state_.skipped.end(), [&](const SkippedSamples& s) {
    return s.step > anomaly.step - anomaly_window_;
  });
}

void AnomalyGuard::restore_running_mean(const AnomalyProgress& saved) {
  state_.loss_mean = saved.loss_mean;
  state_.losses_seen = saved.losses_seen;
}

void AnomalyGuard::restore(const AnomalyProgress& saved) { state_ = saved; }

}  // namespace jumbo
