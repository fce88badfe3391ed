#include "jumbo/train/batch.h"

namespace jumbo {

DatasetBatches::DatasetBatches(const SampleSource& sampler, int64_t micro_batch, int64_t seq,
                               int64_t dp_rank, int64_t dp_size)
    : sampler_(sampler), micro_batch_(micro_batch), seq_(seq), dp_rank_(dp_rank), dp_size_(dp_size) {}

void DatasetBatches::start_step(int64_t consumed_samples) {
  consumed_ = consumed_samples;
  round_ = 0;
}

void DatasetBatches::next(const MicrobatchView& mb) {
  const int64_t first = consumed_ + (round_ * dp_size_ + dp_rank_) * micro_batch_;
  for (int64_t i = 0; i < micro_batch_; ++i) {
    const int64_t at = i * seq_;
    sampler_.sample(first + i, {mb.tokens + at, mb.targets + at,
                                mb.positions ? mb.positions + at : nullptr});
  }
  ++round_;
}

int64_t DatasetBatches::loss_tokens(int64_t first_sample, int64_t count) const {
  if (!sampler_.holds_examples()) return count * seq_;
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += sampler_.loss_tokens(first_sample + i);
  return total;
}

}  // namespace jumbo
