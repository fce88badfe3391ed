#pragma once
// Deterministic faults for the tests of train.on_anomaly and the straggler report, read once
// from JUMBO_TEST_FAULT (comma-separated; docs/config.md "Testing faults"):
//   nan@SAMPLE     the step whose batch holds data-order sample SAMPLE gets NaN gradients
//   spike@SAMPLE   that step's targets are scrambled, as a corrupt shard would be: its loss jumps
//   slow@RANK:MS   world rank RANK spends MS more milliseconds computing every step
// Faults are tied to the data order, not to step numbers, so a skipped or rewound batch does
// not fault again, as bad data would not. Unset: no faults, nothing checked on the step path.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/parallel/pipeline_runner.h"
#include "jumbo/train/step.h"

namespace jumbo {

class FaultInjection {
 public:
  // Throws UserError naming JUMBO_TEST_FAULT and the malformed entry.
  static FaultInjection from_environment();
  static FaultInjection parse(const std::string& text);

  // Whether the batch of samples [first, end) gets NaN gradients or scrambled targets.
  bool nan_in(int64_t first, int64_t end) const { return hits(nan_samples_, first, end); }
  bool spike_in(int64_t first, int64_t end) const { return hits(spike_samples_, first, end); }
  // Extra milliseconds of compute per step on this world rank.
  int64_t slow_ms(int world_rank) const;
  std::string describe() const;  // "" when there are none
  bool empty() const { return nan_samples_.empty() && spike_samples_.empty() && slow_.empty(); }

 private:
  static bool hits(const std::vector<int64_t>& samples, int64_t first, int64_t end);
  std::vector<int64_t> nan_samples_, spike_samples_;
  std::vector<std::pair<int, int64_t>> slow_;  // (world rank, ms)
};

// A step's microbatches with every target moved half the vocabulary away (spike@SAMPLE).
class ScrambledTargets final : public MicrobatchSource {
 public:
  ScrambledTargets(MicrobatchSource& inner, int64_t vocab, int64_t tokens_per_microbatch)
      : inner_(inner), vocab_(vocab), tokens_(tokens_per_microbatch) {}
  void next(const MicrobatchView& mb) override;
  bool holds_examples() const override { return inner_.holds_examples(); }

 private:
  MicrobatchSource& inner_;
  int64_t vocab_, tokens_;
};

// Writes NaN into the first gradient element (nan@SAMPLE), on the device the gradients are on.
void poison_with_nan(Backend& backend, Tensor grads);

// A run's faults as decorations of its steps, so the step loop carries no test branches: the
// request of a step whose batch a fault hits gets the NaN hook, its batch source the scrambled
// targets, and this rank's compute its extra milliseconds.
class StepFaults {
 public:
  StepFaults(FaultInjection faults, Backend& backend, int world_rank, int64_t vocab,
             int64_t tokens_per_microbatch);
  // The step over data-order samples [first, end): decorates `request`; returns the source
  // the step reads (`source`, or its scrambling, valid until the next call).
  MicrobatchSource& apply(StepRequest& request, MicrobatchSource& source, int64_t first,
                          int64_t end);
  void slow_down() const;  // inside the step's compute time (slow@RANK)
  const FaultInjection& injected() const { return faults_; }

 private:
  FaultInjection faults_;
  Backend& backend_;
  int64_t slow_ms_, vocab_, tokens_;
  std::optional<ScrambledTargets> scrambled_;
};

}  // namespace jumbo
