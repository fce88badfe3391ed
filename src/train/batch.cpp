#include "jumbo/train/batch.h"

#include <algorithm>

namespace jumbo {

DatasetBatches::DatasetBatches(const SampleSource& sampler, int64_t micro_batch, int64_t seq,
                               int64_t dp_rank, int64_t dp_size)
    : sampler_(sampler),
      micro_batch_(micro_batch),
      seq_(seq),
      dp_rank_(dp_rank),
      dp_size_(dp_size),
      sample_(seq + 1) {}

void DatasetBatches::start_step(int64_t consumed_samples) {
  consumed_ = consumed_samples;
  round_ = 0;
}

void DatasetBatches::next(int32_t* tokens, int32_t* targets) {
  const int64_t first = consumed_ + (round_ * dp_size_ + dp_rank_) * micro_batch_;
  for (int64_t i = 0; i < micro_batch_; ++i) {
    sampler_.sample(first + i, sample_.data());
    std::copy(sample_.begin(), sample_.end() - 1, tokens + i * seq_);
    std::copy(sample_.begin() + 1, sample_.end(), targets + i * seq_);
  }
  ++round_;
}

}  // namespace jumbo
