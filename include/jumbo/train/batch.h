#pragma once
// Microbatches from a prepared dataset: the global batch of a step is the samples
// [consumed, consumed + global_batch) of the sampler's sequence, so it is the same set of
// samples for every layout; data-parallel rank r takes microbatch rounds k at
// consumed + (k x dp + r) x micro_batch.
#include <cstdint>

#include "jumbo/data/sampler.h"
#include "jumbo/parallel/pipeline_runner.h"

namespace jumbo {

class DatasetBatches final : public MicrobatchSource {
 public:
  DatasetBatches(const SampleSource& sampler, int64_t micro_batch, int64_t seq, int64_t dp_rank,
                 int64_t dp_size);
  // Positions the source at the first microbatch of a step that starts after `consumed` samples.
  void start_step(int64_t consumed_samples);
  void next(const MicrobatchView& microbatch) override;
  bool holds_examples() const override { return sampler_.holds_examples(); }
  // The targets the loss counts in samples [first, first + count): a step's normaliser (the
  // same on every rank and layout, from the sampler's index alone).
  int64_t loss_tokens(int64_t first_sample, int64_t count) const;

 private:
  const SampleSource& sampler_;
  int64_t micro_batch_, seq_, dp_rank_, dp_size_;
  int64_t consumed_ = 0, round_ = 0;
};

}  // namespace jumbo
