#pragma once
// A blend of datasets (Megatron's BlendedDataset rule): global sample i is drawn from the
// dataset whose count lags its weight most, ties to the first, so after any n samples each
// dataset d holds within one sample of n x w_d / W. With integer weights summing to W the
// rule repeats every W samples, so the pick of any index comes from one table of W entries
// (bounded by the weights' precision, not by the datasets): nothing grows with the data, and
// resuming at sample s needs only s. Each dataset keeps its own epoch-by-epoch shuffle.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "jumbo/data/sampler.h"

namespace jumbo {

class Blend {
 public:
  // Weights > 0, any scale. Decimal weights with up to 6 places ("0.6 0.3 0.1") are exact;
  // others are apportioned to a period of at most kMaxPeriod samples.
  explicit Blend(std::span<const double> weights);
  struct Pick {
    size_t dataset;
    int64_t index;  // the dataset's own sample index
  };
  Pick pick(int64_t global_index) const;
  int64_t period() const { return static_cast<int64_t>(period_dataset_.size()); }
  // The integer weights the period holds (sum = period()).
  const std::vector<int64_t>& integer_weights() const { return weights_; }

 private:
  std::vector<int64_t> weights_;
  std::vector<uint32_t> period_dataset_, period_rank_;  // per position within a period
};

class BlendedSampler final : public SampleSource {
 public:
  // One sampler per dataset, in the blend's order.
  BlendedSampler(std::vector<std::unique_ptr<SampleSource>> samplers,
                 std::span<const double> weights);
  void sample(int64_t index, const SampleView& out) const override;
  int64_t loss_tokens(int64_t index) const override;
  bool holds_examples() const override { return holds_examples_; }
  // The blend's period (one pass of the weights' table), for messages.
  int64_t samples_per_epoch() const override { return blend_.period(); }
  const Blend& blend() const { return blend_; }
  const SampleSource& sampler(size_t dataset) const { return *samplers_.at(dataset); }

 private:
  std::vector<std::unique_ptr<SampleSource>> samplers_;
  bool holds_examples_ = false;
  Blend blend_;
};

}  // namespace jumbo
