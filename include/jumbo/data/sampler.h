#pragma once
// GPT sampler: the token stream is cut into samples of seq_len + 1 tokens (inputs and shifted
// targets; consecutive samples share one token). Each epoch visits every sample once in an
// order that is a pseudorandom permutation keyed by (seed, epoch), computed per index by a
// Feistel network: no index array, so its memory does not grow with the dataset.
#include <cstdint>

#include "jumbo/data/indexed_dataset.h"

namespace jumbo {

// Training shuffles each epoch; evaluation reads the samples in stored order.
enum class SampleOrder { shuffled, stored };

// An endless sequence of samples of seq_len + 1 tokens, addressed by index: one dataset's
// sampler or a blend of several.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Writes the seq_len + 1 tokens of sample `index` to out.
  virtual void sample(int64_t index, int32_t* out) const = 0;
};

class GptSampler final : public SampleSource {
 public:
  // Throws UserError naming the dataset if it holds fewer than seq_len + 1 tokens.
  GptSampler(const IndexedDataset& data, int64_t seq_len, uint64_t seed,
             SampleOrder order = SampleOrder::shuffled);
  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  // The sample at position `index` of the endless sequence of epochs: writes seq_len + 1
  // tokens to out.
  void sample(int64_t index, int32_t* out) const override;
  // Which stored sample position `index` maps to (exposed for tests).
  int64_t permuted(int64_t index) const;

 private:
  const IndexedDataset& data_;
  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int64_t samples_per_epoch_;
};

}  // namespace jumbo
