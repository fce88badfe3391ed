#pragma once
// Microbatches from a prepared dataset: the global batch of a step is the samples
// [consumed, consumed + global_batch) of the sampler's sequence, so it is the same set of
// samples for every layout; data-parallel rank r takes microbatch rounds k at
// consumed + (k x dp + r) x micro_batch.
#include <cstdint>
#include <vector>

#include "jumbo/data/sampler.h"
#include "jumbo/parallel/pipeline_runner.h"

namespace jumbo {

class DatasetBatches final : public MicrobatchSource {
 public:
  DatasetBatches(const SampleSource& sampler, int64_t micro_batch, int64_t seq, int64_t dp_rank,
                 int64_t dp_size);
  // Positions the source at the first microbatch of a step that starts after `consumed` samples.
  void start_step(int64_t consumed_samples);
  void next(int32_t* tokens, int32_t* targets) override;

 private:
  const SampleSource& sampler_;
  int64_t micro_batch_, seq_, dp_rank_, dp_size_;
  int64_t consumed_ = 0, round_ = 0;
  std::vector<int32_t> sample_;
};

}  // namespace jumbo
