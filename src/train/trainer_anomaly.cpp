// What the trainer does with an anomalous step (train.on_anomaly; docs/config.md "Anomalies"):
// stop before the update, skip the update, or rewind to the newest checkpoint before the step
// and skip the batches from there. Whatever is skipped is a range of the data order, recorded
// in the anomaly guard and saved with every checkpoint.
#include <fmt/format.h>

#include <cmath>

#include "jumbo/comm/agreed_error.h"
#include "jumbo/train/trainer.h"

namespace jumbo {
namespace {

std::string seen_text(AnomalyKind kind, double loss, double grad_norm) {
  return kind == AnomalyKind::nonfinite
             ? fmt::format("loss is {} (grad norm {})", loss, grad_norm)
             : fmt::format("loss {:.4f} is a spike", loss);
}

}  // namespace

Trainer::AfterAnomaly Trainer::handle_anomaly(StepOutcome& s, TrainSummary& summary) {
  const TrainConfig& t = cfg_.train;
  StepMetrics& m = s.metrics;
  const AnomalyVerdict& verdict = s.verdict;
  const int64_t first_sample = s.first_sample, batch = s.batch;
  const AnomalyKind kind = *verdict.kind;
  const int64_t step = m.step;
  StepAnomaly& a = m.anomaly.emplace();
  a.requested = t.on_anomaly;
  a.running_mean = verdict.running_mean;
  a.threshold = verdict.threshold;
  a.limit = t.max_anomalies;
  a.window = t.anomaly_window;
  SkippedSamples& skipped = a.record;
  skipped = {.step = step, .first_sample = first_sample, .end_sample = first_sample + batch,
             .kind = kind, .action = t.on_anomaly, .loss = m.loss};
  if (t.on_anomaly == AnomalyAction::stop) {
    a.recent = 1;
    log_step(m, true);
    // Every rank holds the same loss and grad norm (all-reduced): every rank stops here alike.
    throw AgreedError(fmt::format(
        "step {}: {}; stopping before the update (train.on_anomaly = \"stop\"). {}", step,
        seen_text(kind, m.loss, m.grad_norm),
        kind == AnomalyKind::nonfinite
            ? fmt::format("Lower train.lr (now {}) or check the data", t.lr)
            : fmt::format("The running mean was {:.4f}; train.spike_ratio = {}; set "
                          "train.on_anomaly = \"skip\" or \"rewind\" to go on",
                          verdict.running_mean, t.spike_ratio)),
        world_->rank() != 0);
  }

  AfterAnomaly after = AfterAnomaly::go_on;
  if (t.on_anomaly == AnomalyAction::rewind) {
    std::optional<Manifest> saved;
    if (checkpointer_) {
      saved = checkpointer_->rewind(checkpoint_pieces(StateUse::load), writes_checkpoint(), step);
    }
    if (saved) {
      restore_loaded_state(*saved);
      anomalies_.restore_running_mean(saved->progress.anomalies);
      // From the checkpoint's place in the data order: every batch through the anomalous one,
      // or train.rewind_skip_batches batches of the checkpoint's batch size.
      skipped.first_sample = progress_.consumed_samples;
      skipped.end_sample = t.rewind_skip_batches == 0
                               ? first_sample + batch
                               : progress_.consumed_samples +
                                     t.rewind_skip_batches * ramp_->at(progress_.consumed_tokens);
      skipped.rewound_to_step = progress_.step;
      summary.rewind_to(progress_.step);
      after = AfterAnomaly::rewound;
    } else {
      skipped.action = AnomalyAction::skip;  // nothing to go back to: the anomaly line says so
    }
  }
  progress_.consumed_samples = skipped.end_sample;  // skipped samples move the data order, not the tokens
  a.recent = anomalies_.record(skipped);
  if (anomalies_.over_limit(a.recent)) {
    log_step(m, true);
    if (checkpointer_) checkpointer_->wait();
    throw AgreedError(fmt::format(
        "step {}: {} anomalies within train.anomaly_window = {} steps, more than "
        "train.max_anomalies = {}: stopping (the last: {}, samples {}-{}); look at the data "
        "there or lower train.lr (now {})",
        step, a.recent, t.anomaly_window, t.max_anomalies, seen_text(kind, m.loss, m.grad_norm),
        skipped.first_sample, skipped.end_sample - 1, t.lr),
        world_->rank() != 0);
  }
  return after;
}

}  // namespace jumbo
